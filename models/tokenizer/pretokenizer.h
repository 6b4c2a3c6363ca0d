#pragma once
// Pre-tokenisation: splits text into pieces before BPE with a sequence of Unicode regexes
// (PCRE2 with UTF + UCP, JIT-compiled). Every step is an "isolated" split as in Hugging Face
// tokenizers' Split(behavior="isolated") and llama.cpp's unicode_regex_split: matches and the
// text between them both become pieces, so the pieces always cover the input exactly.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dtr::tokenizer {

/// GPT-2's pattern (HF ByteLevel pre-tokenizer with use_regex=true).
extern const char* const kGpt2Pattern;

/// A compiled regex split. Thread-safe (match data is per call).
class RegexSplit {
 public:
  /// Errors: the pattern does not compile -> dtr::Error with PCRE2's message and offset.
  explicit RegexSplit(const std::string& pattern);
  ~RegexSplit();
  RegexSplit(const RegexSplit&) = delete;
  RegexSplit& operator=(const RegexSplit&) = delete;
  /// Appends the pieces of `text` (valid UTF-8) to `out`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

/// A sequence of regex splits.
class PreTokenizer {
 public:
  explicit PreTokenizer(const std::vector<std::string>& patterns);
  /// Pieces of `text` (must be valid UTF-8; views into it).
  std::vector<std::string_view> split(std::string_view text) const;
  std::vector<std::string> patterns() const;

  /// The pre-tokenizer of a GGUF `tokenizer.ggml.pre` name (llama.cpp's names): "gpt2",
  /// "default" (GPT-2), "smollm" / "starcoder" / "refact" / "codeshell" (digits split one by
  /// one, then GPT-2), "llama3" / "llama-bpe", "qwen2". Errors: unknown name -> dtr::Error
  /// listing the known ones.
  static std::shared_ptr<PreTokenizer> from_gguf_name(const std::string& name);
  /// The inverse: the GGUF name of a list of patterns ("gpt2", "smollm", "llama-bpe", "qwen2"),
  /// or "" when no GGUF name has them.
  static std::string gguf_name(const std::vector<std::string>& patterns);

 private:
  std::vector<std::shared_ptr<RegexSplit>> steps_;
};

}  // namespace dtr::tokenizer
