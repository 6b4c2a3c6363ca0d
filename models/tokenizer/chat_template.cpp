#include "models/tokenizer/chat_template.h"

#include "tensor/error.h"

namespace dtr::tokenizer {

namespace {

/// Jinja's `trim`: leading and trailing whitespace removed.
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\v\f";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

struct Builder {
  std::vector<ChatSegment> out;
  void add(std::string s, bool train) {
    if (s.empty()) return;
    if (!out.empty() && out.back().train == train) out.back().text += s;
    else out.push_back({std::move(s), train});
  }
};

/// The system message folded into the first user turn (Gemma, Mistral): the rest of the
/// messages and the prefix of the first one.
std::vector<ChatMessage> fold_system(const std::vector<ChatMessage>& messages, const std::string& kind) {
  std::vector<ChatMessage> rest;
  std::string prefix;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    DTR_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", "chat template ", kind, ": role '",
              m.role, "' is not supported (system, user, assistant)");
    if (m.role == "system") {
      DTR_CHECK(i == 0, "chat template ", kind, ": a system message must come first (message ", i, ")");
      prefix = m.content + "\n\n";
      continue;
    }
    rest.push_back(m);
  }
  if (!prefix.empty() && !rest.empty()) rest[0].content = prefix + (kind == "gemma" ? trim(rest[0].content) : rest[0].content);
  return rest;
}

}  // namespace

ChatTemplate ChatTemplate::chatml(std::string default_system) {
  ChatTemplate t;
  t.default_system_ = std::move(default_system);
  return t;
}

ChatTemplate ChatTemplate::smollm2() {
  return chatml("You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

std::string ChatTemplate::names() { return "chatml, smollm2, gemma, llama3, mistral"; }

ChatTemplate ChatTemplate::from_name(const std::string& name) {
  if (name == "chatml") return chatml();
  if (name == "smollm2") return smollm2();
  DTR_CHECK(name == "gemma" || name == "llama3" || name == "mistral", "chat template '", name,
            "' is not supported (", names(), ")");
  ChatTemplate t;
  t.kind_ = name;
  return t;
}

ChatTemplate ChatTemplate::from_jinja(const std::string& jinja) {
  auto has = [&](const char* s) { return jinja.find(s) != std::string::npos; };
  // Templates that share a marker with a known one but render differently are refused, not
  // approximated: Llama 2 (<<SYS>> blocks), Llama 3.1+ (a dated system header), Mistral v0.1 (a
  // space after </s>) and v0.3 ("[/INST]" without the space before it).
  auto refuse = [&](const char* which) {
    DTR_ERROR("chat template not supported: ", which, " (", names(),
              " are known; set dataset.chat_template to the one that renders it): '", jinja.substr(0, 80), "...'");
  };
  if (has("<start_of_turn>")) return from_name("gemma");
  if (has("<|start_header_id|>")) {
    if (has("Cutting Knowledge Date")) refuse("Llama 3.1+ (dated system header, tools)");
    return from_name("llama3");
  }
  if (has("[INST]")) {
    if (has("<<SYS>>")) refuse("Llama 2 (<<SYS>> system block)");
    if (has("eos_token + ' '")) refuse("Mistral-Instruct v0.1 (a space after </s>)");
    if (!has(" [/INST]")) refuse("Mistral-Instruct v0.3 ([/INST] without a space before it)");
    return from_name("mistral");
  }
  DTR_CHECK(has("<|im_start|>") && has("<|im_end|>"), "chat template not recognised (", names(),
            " are known; set dataset.chat_template): '", jinja.substr(0, 80), "...'");
  // SmolLM2 style: {{ '<|im_start|>system\n<default text><|im_end|>\n' }} guarded by a test that
  // the first message is not a system message.
  const std::string open = "<|im_start|>system\n";
  const size_t a = jinja.find(open);
  if (a != std::string::npos && jinja.find("!= 'system'") != std::string::npos) {
    const size_t b = jinja.find("<|im_end|>", a);
    if (b != std::string::npos) return chatml(jinja.substr(a + open.size(), b - a - open.size()));
  }
  return chatml();
}

std::vector<ChatSegment> ChatTemplate::render_segments(const std::vector<ChatMessage>& messages,
                                                       bool add_generation_prompt) const {
  Builder b;
  for (const auto& m : messages) DTR_CHECK(!m.role.empty(), "chat template: a message has an empty role");
  if (kind_ == "gemma") {
    b.add("<bos>", false);
    for (const auto& m : fold_system(messages, kind_)) {
      const bool train = m.role == "assistant";
      b.add("<start_of_turn>" + std::string(train ? "model" : m.role) + "\n", false);
      b.add(trim(m.content), train);
      b.add("<end_of_turn>", train);
      b.add("\n", false);
    }
    if (add_generation_prompt) b.add("<start_of_turn>model\n", false);
    return b.out;
  }
  if (kind_ == "llama3") {
    b.add("<|begin_of_text|>", false);
    for (const auto& m : messages) {
      const bool train = m.role == "assistant";
      b.add("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n", false);
      b.add(trim(m.content), train);
      b.add("<|eot_id|>", train);
    }
    if (add_generation_prompt) b.add("<|start_header_id|>assistant<|end_header_id|>\n\n", false);
    return b.out;
  }
  if (kind_ == "mistral") {
    b.add("<s>", false);
    for (const auto& m : fold_system(messages, kind_)) {
      if (m.role == "user") {
        b.add("[INST] " + m.content + " [/INST]", false);
      } else {
        b.add(m.content, true);
        b.add("</s>", true);
      }
    }
    return b.out;  // the generation prompt is the end of the last [INST] turn
  }
  if (!default_system_.empty() && (messages.empty() || messages[0].role != "system") && !messages.empty())
    b.add(std::string(kStart) + "system\n" + default_system_ + kEnd + "\n", false);
  for (const auto& m : messages) {
    const bool train = m.role == "assistant";
    b.add(std::string(kStart) + m.role + "\n", false);
    b.add(m.content, train);
    b.add(kEnd, train);
    b.add("\n", false);
  }
  if (add_generation_prompt) b.add(std::string(kStart) + "assistant\n", false);
  return b.out;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string s;
  for (const auto& seg : render_segments(messages, add_generation_prompt)) s += seg.text;
  return s;
}

}  // namespace dtr::tokenizer
