#include "models/tokenizer/chat_template.h"

#include "tensor/error.h"

namespace dtr::tokenizer {

ChatTemplate ChatTemplate::chatml(std::string default_system) {
  ChatTemplate t;
  t.default_system_ = std::move(default_system);
  return t;
}

ChatTemplate ChatTemplate::smollm2() {
  return chatml("You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

ChatTemplate ChatTemplate::from_jinja(const std::string& jinja) {
  DTR_CHECK(jinja.find("<|im_start|>") != std::string::npos && jinja.find("<|im_end|>") != std::string::npos,
            "chat template is not ChatML (only ChatML is supported): '", jinja.substr(0, 80), "...'");
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
  std::vector<ChatSegment> out;
  auto add = [&](std::string s, bool train) {
    if (s.empty()) return;
    if (!out.empty() && out.back().train == train) out.back().text += s;
    else out.push_back({std::move(s), train});
  };
  if (!default_system_.empty() && (messages.empty() || messages[0].role != "system") && !messages.empty())
    add(std::string(kStart) + "system\n" + default_system_ + kEnd + "\n", false);
  for (const auto& m : messages) {
    DTR_CHECK(!m.role.empty(), "chat template: a message has an empty role");
    const bool train = m.role == "assistant";
    add(std::string(kStart) + m.role + "\n", false);
    add(m.content, train);
    add(kEnd, train);
    add("\n", false);
  }
  if (add_generation_prompt) add(std::string(kStart) + "assistant\n", false);
  return out;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string s;
  for (const auto& seg : render_segments(messages, add_generation_prompt)) s += seg.text;
  return s;
}

}  // namespace dtr::tokenizer
