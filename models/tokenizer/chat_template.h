#pragma once
// The ChatML chat template used by SmolLM2-Instruct (and Qwen, Hermes ...):
//   <|im_start|>{role}\n{content}<|im_end|>\n  for every message, then, with the generation
//   prompt, <|im_start|>assistant\n
// SmolLM2-Instruct's template also inserts a default system message when the conversation
// does not start with one. Rendering is exact string building (no Jinja engine): the template
// string of a model is only inspected to recognise ChatML and its default system text.
#include <string>
#include <vector>

namespace dtr::tokenizer {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

/// A piece of rendered text; `train` is true for text the model should learn to produce
/// (assistant contents and the <|im_end|> closing them), false for the prompt.
struct ChatSegment {
  std::string text;
  bool train = false;
};

class ChatTemplate {
 public:
  /// Plain ChatML; `default_system` (if not empty) is inserted when messages[0] is not a
  /// system message.
  static ChatTemplate chatml(std::string default_system = "");
  /// SmolLM2-Instruct's template: ChatML with the default system message
  /// "You are a helpful AI assistant named SmolLM, trained by Hugging Face".
  static ChatTemplate smollm2();
  /// Recognises a Jinja chat template string (e.g. GGUF tokenizer.chat_template): ChatML with
  /// or without a default system message. Errors: not ChatML -> dtr::Error quoting its start.
  static ChatTemplate from_jinja(const std::string& jinja);

  /// The conversation as text. Errors: empty role.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  /// The same text split into prompt / trainable segments (their concatenation == render()).
  std::vector<ChatSegment> render_segments(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const;

  const std::string& default_system() const { return default_system_; }
  static constexpr const char* kStart = "<|im_start|>";
  static constexpr const char* kEnd = "<|im_end|>";

 private:
  std::string default_system_;
};

}  // namespace dtr::tokenizer
