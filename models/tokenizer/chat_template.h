#pragma once
// Chat templates of the model families, rendered by exact string building (no Jinja engine); a
// model's own Jinja template string is only inspected to recognise which one it is.
//   chatml  (SmolLM2, Qwen2 / Qwen3, Hermes ...):
//             <|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//           smollm2 = ChatML with SmolLM2-Instruct's default system message when the conversation
//           does not start with one.
//   gemma   (Gemma 2 / 3): <bos><start_of_turn>{user|model}\n{content | trim}<end_of_turn>\n ...
//           [<start_of_turn>model\n]; a system message is prepended to the first user turn
//           ("{system}\n\n{user}"), as Gemma's template does.
//   llama3  (Llama 3): <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content |
//           trim}<|eot_id|> ... [<|start_header_id|>assistant<|end_header_id|>\n\n]
//   mistral (Mistral-Instruct v0.1 / v0.2): <s>[INST] {user} [/INST]{assistant}</s> ...; a system
//           message is prepended to the first user turn ("{system}\n\n{user}").
// Trainable segments: the assistant contents and the end-of-turn token that closes them
// (<|im_end|>, <end_of_turn>, <|eot_id|>, </s>).
#include <string>
#include <vector>

namespace dtr::tokenizer {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

/// A piece of rendered text; `train` is true for text the model should learn to produce
/// (assistant contents and the end-of-turn token closing them), false for the prompt.
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
  /// By name (dataset.chat_template): chatml | smollm2 | gemma | llama3 | mistral.
  /// Errors: another name -> dtr::Error listing the choices.
  static ChatTemplate from_name(const std::string& name);
  /// The names from_name accepts, comma separated.
  static std::string names();
  /// Recognises a Jinja chat template string (e.g. GGUF tokenizer.chat_template) by its markers:
  /// <|im_start|> (ChatML, with its default system message if it inserts one), <start_of_turn>
  /// (gemma), <|start_header_id|> (llama3), [INST] (mistral). Checked against the real templates
  /// of Gemma 3, Llama 3 Instruct and Mistral-7B-Instruct-v0.2 (tests/golden/chat_templates_real.json).
  /// Errors: none of them, or a variant rendered differently (Llama 2 <<SYS>>, Llama 3.1+ dated
  /// system header, Mistral v0.1 / v0.3 spacing) -> dtr::Error quoting its start and naming the choices.
  static ChatTemplate from_jinja(const std::string& jinja);

  /// The conversation as text. Errors: empty role; for gemma / mistral a role other than
  /// system / user / assistant, a system message that is not the first.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  /// The same text split into prompt / trainable segments (their concatenation == render()).
  std::vector<ChatSegment> render_segments(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const;

  /// chatml | gemma | llama3 | mistral (smollm2 is chatml with a default system message).
  const std::string& kind() const { return kind_; }
  const std::string& default_system() const { return default_system_; }
  static constexpr const char* kStart = "<|im_start|>";
  static constexpr const char* kEnd = "<|im_end|>";

 private:
  std::string kind_ = "chatml";
  std::string default_system_;
};

}  // namespace dtr::tokenizer
