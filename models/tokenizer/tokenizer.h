#pragma once
// The tokenizer interface the datasets and apps use, and the loader that picks the kind from a
// file: byte-level BPE (BPETokenizer: SmolLM2, Llama 3, Qwen ...) or SentencePiece-style BPE with
// byte fallback (SentencePieceTokenizer: Gemma).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtr::tokenizer {

/// Thread-safe encode / decode over a fixed vocabulary.
class Tokenizer {
 public:
  using Offsets = std::vector<std::pair<size_t, size_t>>;
  virtual ~Tokenizer() = default;
  /// Token ids of `text` (valid UTF-8). `add_special`: prepend bos when the vocab says so.
  /// `parse_special`: recognise special / added token text (e.g. "<|im_start|>") as that token.
  /// Errors: invalid UTF-8 -> dtr::Error with the byte offset.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special = false,
                                      bool parse_special = true) const = 0;
  /// encode() that also gives each token's byte range [begin, end) in `text`; the ranges of
  /// consecutive tokens tile the text (a bos token has the empty range [0, 0)).
  virtual std::vector<int32_t> encode_with_offsets(std::string_view text, Offsets& offsets, bool add_special = false,
                                                   bool parse_special = true) const = 0;
  /// Bytes of the tokens concatenated (may end inside a UTF-8 sequence). `skip_special` drops
  /// control tokens. Errors: an id outside the vocab.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual int64_t vocab_size() const = 0;
  /// The token's text as the vocabulary spells it. Errors: an id outside the vocab.
  virtual const std::string& token(int32_t id) const = 0;
  /// Id of a token text, or -1.
  virtual int32_t token_to_id(const std::string& text) const = 0;
  /// True for control tokens (bos, eos, <|im_start|> ...).
  virtual bool is_special(int32_t id) const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;

 protected:
  /// decode for tokenizers that keep each id's decoded bytes: the concatenation of
  /// token_bytes[id] (control tokens left out when skip_special). Errors: an id outside
  /// [0, token_bytes.size()) -> dtr::Error naming it.
  std::string decode_token_bytes(const std::vector<std::string>& token_bytes, const std::vector<int32_t>& ids,
                                 bool skip_special) const;
};

/// The tokenizer of a model file: a GGUF (tokenizer.ggml.model "gpt2" -> BPETokenizer, "llama" ->
/// SentencePieceTokenizer), a tokenizer.json (model BPE; byte_fallback -> SentencePieceTokenizer),
/// or a directory holding tokenizer.json. Errors: a missing file, another tokenizer model ->
/// dtr::Error naming the file and the kinds that are supported.
std::shared_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace dtr::tokenizer
