#pragma once
// SentencePiece-style BPE tokenizer (Gemma; GGUF tokenizer.ggml.model "llama"; HF tokenizer.json
// model BPE with byte_fallback), with Hugging Face's semantics (GemmaTokenizer of transformers'
// GGUF loader):
//   added tokens: control tokens (special) and user-defined tokens found whole in the raw text,
//     longest first (HF AddedVocabulary);
//   normalizer: " " -> "\u2581" (no dummy prefix);
//   model: BPE over the characters of each remaining segment (one word: no pre-tokenizer splits
//     it), merges by rank; a character with no token falls back to its UTF-8 bytes as <0xXX>
//     tokens (else <unk>);
//   decoder: "\u2581" -> " ", <0xXX> -> the byte, control tokens as text.
// From GGUF the merges are not stored: they are rebuilt from the vocabulary as transformers does
// (generate_merges): for every token t and every split t = l + r with l, r in the vocabulary, one
// merge ranked by t's priority, then by len(l), len(r) (longest first). The priority is the token's
// position in the file for Gemma (transformers: Gemma's scores do not follow its merge order) and
// its score otherwise; Gemma's whitespace-only tokens stored with real spaces ("  ") are respelled
// "\u2581\u2581" first, as transformers does.
// Why not libsentencepiece: it would need a serialized ModelProto built from the GGUF, and its
// BPE ranks pieces by score, which for Gemma's GGUF is not the order Hugging Face merges in, so
// it could not reproduce HF's ids; the algorithm above is HF tokenizers' BPE, which dtr already
// has (bpe_merge.h).
// Source: transformers integrations/gguf/gguf_tokenizer_mapping.py (gemma_tokenizer),
// tokenization_utils_base.generate_merges, models/gemma/tokenization_gemma.py; HF tokenizers BPE.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "models/tokenizer/bpe_merge.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "models/tokenizer/tokenizer.h"

namespace dtr {
namespace gguf { class GGUFFile; }
namespace tokenizer {

/// What a SentencePiece-style tokenizer is built from.
struct SentencePieceVocab {
  std::vector<std::string> tokens;      // id -> text ("\u2581" for spaces; <0xXX> byte tokens)
  std::vector<TokenType> types;         // id -> type (empty = all normal)
  std::vector<std::pair<std::string, std::string>> merges;  // by rank, highest priority first
  int32_t bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;
  bool add_bos = false;                 // prepend bos in encode(add_special = true)
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  /// Errors: a merge naming a token not in the vocabulary, types of the wrong size.
  explicit SentencePieceTokenizer(SentencePieceVocab vocab);
  /// From GGUF metadata (tokenizer.ggml.model "llama"): tokens, scores, token_type, bos / eos /
  /// unknown / padding ids, add_bos_token; merges rebuilt as described above.
  /// Errors: missing keys, add_space_prefix = true (SentencePiece's dummy prefix is not built).
  static SentencePieceTokenizer from_gguf(const gguf::GGUFFile& g);
  /// From a parsed tokenizer.json with model BPE and byte_fallback true, normalizer Replace(" ",
  /// "\u2581") and no pre-tokenizer (or Split on " ", which then has nothing to split).
  /// Errors: other normalizers / pre-tokenizers (e.g. a Prepend dummy prefix), missing fields.
  static SentencePieceTokenizer from_hf_json(const nlohmann::json& j, const std::string& source);

  std::vector<int32_t> encode(std::string_view text, bool add_special = false, bool parse_special = true) const override;
  std::vector<int32_t> encode_with_offsets(std::string_view text, Offsets& offsets, bool add_special = false,
                                           bool parse_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.tokens.size()); }
  const std::string& token(int32_t id) const override;
  int32_t token_to_id(const std::string& text) const override;
  bool is_special(int32_t id) const override;
  int32_t bos_id() const override { return vocab_.bos_id; }
  int32_t eos_id() const override { return vocab_.eos_id; }
  int32_t pad_id() const override { return vocab_.pad_id; }
  const SentencePieceVocab& vocab() const { return vocab_; }

 private:
  std::vector<int32_t> encode_impl(std::string_view text, bool add_special, bool parse_special, Offsets* offsets) const;
  /// BPE of one plain segment text[begin, end) (not normalised yet).
  void encode_segment(std::string_view text, size_t begin, size_t end, std::vector<int32_t>& out, Offsets* offsets) const;

  SentencePieceVocab vocab_;
  std::unordered_map<std::string, int32_t> token_to_id_;  // the last id of a text wins (HF's vocab dict)
  MergeTable merges_;
  int32_t byte_token_[256];
  std::vector<std::string> token_bytes_;  // decoded bytes of each id
  SpecialTokens specials_;
};

/// Merges implied by a vocabulary (transformers' generate_merges with vocab_scores): for each
/// token in `order` (ids; duplicates of a text count once, at their first place) with priority
/// `priority[id]`, every split into two tokens of `tokens`, sorted by (priority, len(left),
/// len(right)) descending, stable. Lengths in code points.
std::vector<std::pair<std::string, std::string>> merges_from_vocab(const std::vector<std::string>& tokens,
                                                                   const std::vector<double>& priority);

}  // namespace tokenizer
}  // namespace dtr
