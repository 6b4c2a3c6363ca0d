// The chat templates of the families (ChatML / SmolLM2, Gemma, Llama 3, Mistral): rendered text
// (as each model's Jinja template renders it), trainable segments, recognition from a model's
// template text, and errors naming the choices.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/tokenizer/chat_template.h"
#include "models/tokenizer/tokenizer.h"

using namespace dtr::tokenizer;
using Catch::Matchers::Contains;

namespace {

const std::vector<ChatMessage> kConv = {
    {"system", "Be brief."}, {"user", " What is Perl? "}, {"assistant", "A language.\n"}, {"user", "Who made it?"}};

std::string trained(const ChatTemplate& t, const std::vector<ChatMessage>& m) {
  std::string s;
  for (const auto& seg : t.render_segments(m, false))
    if (seg.train) s += seg.text + "|";
  return s;
}

}  // namespace

TEST_CASE("chat templates render as the models' own templates", "[chat_template]") {
  CHECK(ChatTemplate::from_name("gemma").render(kConv, true) ==
        "<bos><start_of_turn>user\nBe brief.\n\nWhat is Perl?<end_of_turn>\n<start_of_turn>model\nA language.<end_of_turn>\n"
        "<start_of_turn>user\nWho made it?<end_of_turn>\n<start_of_turn>model\n");
  CHECK(ChatTemplate::from_name("llama3").render(kConv, true) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is Perl?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nA language.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWho made it?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(ChatTemplate::from_name("mistral").render(kConv, true) ==
        "<s>[INST] Be brief.\n\n What is Perl?  [/INST]A language.\n</s>[INST] Who made it? [/INST]");
  CHECK(ChatTemplate::from_name("chatml").render({kConv[1], kConv[2]}, false) ==
        "<|im_start|>user\n What is Perl? <|im_end|>\n<|im_start|>assistant\nA language.\n<|im_end|>\n");
  // Only assistant contents and the end-of-turn closing them are trained.
  CHECK(trained(ChatTemplate::from_name("gemma"), kConv) == "A language.<end_of_turn>|");
  CHECK(trained(ChatTemplate::from_name("llama3"), kConv) == "A language.<|eot_id|>|");
  CHECK(trained(ChatTemplate::from_name("mistral"), kConv) == "A language.\n</s>|");
  for (const char* n : {"chatml", "smollm2", "gemma", "llama3", "mistral"}) {
    const ChatTemplate t = ChatTemplate::from_name(n);
    std::string cat;
    for (const auto& seg : t.render_segments(kConv, true)) cat += seg.text;
    CHECK(cat == t.render(kConv, true));
  }
}

TEST_CASE("chat templates are recognised from the model's template text; bad input is named", "[chat_template]") {
  CHECK(ChatTemplate::from_jinja("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}").kind() == "gemma");
  CHECK(ChatTemplate::from_jinja("<|start_header_id|>{{ m.role }}<|end_header_id|>").kind() == "llama3");
  CHECK(ChatTemplate::from_jinja("{{ '[INST] ' + m.content + ' [/INST]' }}").kind() == "mistral");
  CHECK(ChatTemplate::from_jinja("<|im_start|>{{ m.role }}<|im_end|>").kind() == "chatml");
  CHECK_THROWS_WITH(ChatTemplate::from_name("vicuna"), Contains("'vicuna'") && Contains("chatml, smollm2, gemma, llama3, mistral"));
  CHECK_THROWS_WITH(ChatTemplate::from_name("gemma").render({{"tool", "x"}}, false), Contains("role 'tool'"));
  CHECK_THROWS_WITH(ChatTemplate::from_name("mistral").render({{"user", "a"}, {"system", "b"}}, false),
                    Contains("system message must come first"));
}

TEST_CASE("the models' real Jinja templates are recognised and rendered as transformers renders them", "[chat_template]") {
  // tests/golden/chat_templates_real.json (make_chat_template_fixture.py): Gemma 3, Llama 3
  // Instruct and Mistral-7B-Instruct-v0.2's own template strings, conversations rendered by
  // transformers' render_jinja_template; Gemma's texts also as the ids of the 270M GGUF's tokenizer.
  std::ifstream in("tests/golden/chat_templates_real.json");
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  const char* gguf = "data/gemma3-270m-q4_k_m.gguf";
  std::shared_ptr<Tokenizer> gemma_tok;
  if (std::filesystem::exists(gguf)) gemma_tok = load_tokenizer(gguf);
  else WARN("SKIP (ids only): " << gguf << " not found");
  int cases = 0, id_cases = 0;
  for (const auto& t : j["templates"]) {
    const std::string kind = t["kind"];
    INFO(kind << " from " << t["source"].get<std::string>());
    const ChatTemplate tmpl = ChatTemplate::from_jinja(t["jinja"].get<std::string>());
    CHECK(tmpl.kind() == kind);
    for (const auto& c : t["cases"]) {
      std::vector<ChatMessage> msgs;
      for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
      const std::string text = tmpl.render(msgs, c["add_generation_prompt"].get<bool>());
      CHECK(text == c["text"].get<std::string>());
      ++cases;
      if (c.contains("ids") && gemma_tok) {
        const auto ids = gemma_tok->encode(text);
        CHECK(std::vector<int32_t>(ids.begin(), ids.end()) == c["ids"].get<std::vector<int32_t>>());
        ++id_cases;
      }
    }
  }
  CHECK(cases == 13);
  if (gemma_tok) CHECK(id_cases == 5);
  // Variants that share a marker but render differently are refused, naming the variant.
  CHECK_THROWS_WITH(ChatTemplate::from_jinja("{{ '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}"),
                    Contains("Llama 2"));
  CHECK_THROWS_WITH(ChatTemplate::from_jinja("{{ message['content'] + eos_token + ' ' }}{{ '[INST] ' + c + ' [/INST]' }}"),
                    Contains("Mistral-Instruct v0.1"));
  CHECK_THROWS_WITH(ChatTemplate::from_jinja("{{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}"),
                    Contains("Mistral-Instruct v0.3"));
  CHECK_THROWS_WITH(ChatTemplate::from_jinja("<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date: Dec"),
                    Contains("Llama 3.1+"));
}
