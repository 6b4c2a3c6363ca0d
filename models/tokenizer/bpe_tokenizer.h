#pragma once
// Byte-level BPE tokenizer (GPT-2 family: SmolLM2, Llama 3, Qwen2, StarCoder ...), loaded
// from GGUF metadata (tokenizer.ggml.*) or from a Hugging Face tokenizer.json.
// Encoding: validate UTF-8 -> split out special tokens (control / user-defined tokens, longest
// match first) -> pre-tokenise each remaining segment with the model's regexes -> map bytes
// with the GPT-2 byte map -> apply merges by rank (lowest first, leftmost on ties).
// Decoding: concatenate the bytes of each token (the inverse byte map; special tokens as text).
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "models/tokenizer/bpe_merge.h"
#include "models/tokenizer/pretokenizer.h"
#include "models/tokenizer/tokenizer.h"

namespace dtr {
namespace gguf { class GGUFFile; class GGUFWriter; }
namespace tokenizer {

/// GGUF token types (llama.cpp's llama_token_type).
enum class TokenType : int32_t { undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

/// Text of token `id` of an id -> text table (every tokenizer kind's `token()`).
/// Errors: `id` outside [0, tokens.size()).
const std::string& vocab_token(const std::vector<std::string>& tokens, int32_t id);
/// True when `id` is a control token of an id -> type table (empty table: none are).
bool vocab_is_control(const std::vector<TokenType>& types, int32_t id);

/// Everything a BPE tokenizer is built from (what GGUF and tokenizer.json both provide).
struct BPEVocab {
  std::vector<std::string> tokens;              // id -> token text (byte-level mapped)
  std::vector<TokenType> types;                 // id -> type (empty = all normal)
  std::vector<std::pair<std::string, std::string>> merges;  // by rank, highest priority first
  std::vector<std::string> pre_patterns = {kGpt2Pattern};   // pre-tokenizer regex steps
  int32_t bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;
  bool add_bos = false;                         // prepend bos in encode(add_special = true)
  bool ignore_merges = false;                   // a whole piece found in the vocab is one token
};

/// Movable, not copyable; encode/decode are thread-safe.
class BPETokenizer : public Tokenizer {
 public:
  /// Errors: a merge naming a token not in the vocab, a byte without a single-byte token,
  /// duplicate tokens -> dtr::Error naming the entry.
  explicit BPETokenizer(BPEVocab vocab);

  /// From GGUF metadata: tokenizer.ggml.model must be "gpt2"; tokens, merges ("a b" strings),
  /// token_type, bos/eos/padding/unknown ids, add_bos_token, and tokenizer.ggml.pre for the
  /// regexes. Errors: missing keys, other tokenizer models -> dtr::Error naming key and file.
  static BPETokenizer from_gguf(const gguf::GGUFFile& g);
  /// From a parsed tokenizer.json: model.type "BPE" (vocab, merges as "a b" or ["a","b"]),
  /// added_tokens (special ones are split out), pre_tokenizer ByteLevel / Digits / Split
  /// (regex, isolated) / Sequence of those. `bos`/`eos` token strings may be given (from
  /// tokenizer_config.json). Errors: unsupported model/normalizer/pre-tokenizer types.
  static BPETokenizer from_hf_json(const nlohmann::json& j, const std::string& source,
                                   const std::string& bos_token = "", const std::string& eos_token = "");
  /// From a tokenizer.json file (reads tokenizer_config.json beside it for bos/eos if present).
  static BPETokenizer from_hf_file(const std::string& path);

  /// Token ids of `text` (valid UTF-8). `add_special`: prepend bos when the vocab says so.
  /// `parse_special`: recognise special-token text (e.g. "<|im_start|>") as that token;
  /// otherwise it is tokenised as plain text. Errors: invalid UTF-8 -> dtr::Error with the
  /// byte offset.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false, bool parse_special = true) const override;
  /// encode() that also gives each token's byte range [begin, end) in `text` (`offsets` is
  /// resized to the number of ids; a bos token has the empty range [0, 0)). The ranges of
  /// consecutive tokens tile the text: a byte-level token covers exactly the bytes it decodes
  /// to, a special token its text. Hugging Face tokenizers' Encoding.offsets are the same
  /// ranges in characters. Errors: as encode().
  std::vector<int32_t> encode_with_offsets(std::string_view text, Offsets& offsets,
                                           bool add_special = false, bool parse_special = true) const override;
  /// Bytes of the tokens concatenated (may end inside a UTF-8 sequence). `skip_special`
  /// drops control tokens. Errors: an id outside the vocab.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;

  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.tokens.size()); }
  const std::string& token(int32_t id) const override;
  /// Id of a token text, or -1.
  int32_t token_to_id(const std::string& text) const override;
  bool is_special(int32_t id) const override;
  int32_t bos_id() const override { return vocab_.bos_id; }
  int32_t eos_id() const override { return vocab_.eos_id; }
  int32_t pad_id() const override { return vocab_.pad_id; }
  const BPEVocab& vocab() const { return vocab_; }

 private:
  /// encode / encode_with_offsets; `offsets` may be null.
  std::vector<int32_t> encode_impl(std::string_view text, bool add_special, bool parse_special, Offsets* offsets) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  /// Appends the byte ranges of ids[first..) (the tokens of `piece`, which starts at byte
  /// `begin` of the text).
  void piece_offsets(std::string_view piece, size_t begin, const std::vector<int32_t>& ids, size_t first,
                     Offsets& offsets) const;
  /// BPE of one piece; `lens` (optional) receives the byte length of each id.
  void bpe(std::string_view piece, std::vector<int32_t>& out, std::vector<size_t>* lens = nullptr) const;

  BPEVocab vocab_;
  std::shared_ptr<PreTokenizer> pre_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  MergeTable merges_;
  int32_t byte_token_[256];
  std::vector<std::string> token_bytes_;  // decoded bytes of each id
  SpecialTokens specials_;                // control / user-defined token texts
  struct Cache {  // piece -> ids; behind a pointer so the tokenizer stays movable
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> map;
  };
  std::unique_ptr<Cache> cache_ = std::make_unique<Cache>();
};

}  // namespace tokenizer
}  // namespace dtr

namespace dtr::tokenizer {

/// The tokenizer as a Hugging Face tokenizer.json object (model BPE with vocab and "a b"
/// merges, added_tokens for control / user-defined tokens, the pre-tokenizer as
/// Digits + ByteLevel / ByteLevel / Split + ByteLevel, ByteLevel decoder). Loading it back with
/// BPETokenizer::from_hf_json (or HF tokenizers) gives the same ids.
nlohmann::json to_hf_json(const BPETokenizer& tok);

/// A tokenizer_config.json object: bos/eos/pad/unk token texts, add_bos_token,
/// chat_template (if not empty), model_max_length, tokenizer_class PreTrainedTokenizerFast (the
/// class that runs tokenizer.json as written; GPT2Tokenizer would re-implement GPT-2's
/// pre-tokenizer and ignore the digit / Unicode splits tokenizer.json holds).
nlohmann::json to_hf_tokenizer_config(const BPETokenizer& tok, const std::string& chat_template,
                                      int64_t model_max_length);

/// The tokenizer as GGUF metadata, the inverse of BPETokenizer::from_gguf (what llama.cpp's
/// convert_hf_to_gguf.py writes): tokenizer.ggml.model "gpt2", .pre (the GGUF name of the
/// regexes), .tokens, .token_type, .merges ("a b"), .bos/.eos/.padding/.unknown_token_id (those
/// set), .add_bos_token, and tokenizer.chat_template when not empty. A `vocab_size` above the
/// token count pads the list with "[PAD<i>]" tokens of type unused, as llama.cpp does.
/// Errors: regexes without a GGUF pre-tokenizer name, vocab_size below the token count.
void add_gguf_tokenizer(gguf::GGUFWriter& w, const BPETokenizer& tok, const std::string& chat_template,
                        int64_t vocab_size);

/// Writes tokenizer.json and tokenizer_config.json into `dir` (atomically each).
void save_hf_tokenizer(const BPETokenizer& tok, const std::string& dir, const std::string& chat_template = "",
                       int64_t model_max_length = 8192);

}  // namespace dtr::tokenizer
