#pragma once
// Pieces shared by the BPE tokenizers (byte-level BPETokenizer, SentencePieceTokenizer):
//  - MergeTable and bpe_merge: the merge loop of Hugging Face tokenizers' BPE word (lowest rank
//    first, leftmost on ties), over symbol ids with their byte lengths;
//  - SpecialTokens: added / special token texts matched in raw text, longest first at each
//    position (HF tokenizers' AddedVocabulary, leftmost-longest).
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dtr::tokenizer {

/// (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  void reserve(size_t n) { map_.reserve(n); }
  /// Adds a merge; a pair added twice keeps its first (lowest) rank.
  void add(int32_t left, int32_t right, int32_t rank, int32_t merged) {
    map_.emplace(key(left, right), std::make_pair(rank, merged));
  }
  /// (rank, merged id) of a pair, or nullptr.
  const std::pair<int32_t, int32_t>* find(int32_t left, int32_t right) const {
    auto it = map_.find(key(left, right));
    return it == map_.end() ? nullptr : &it->second;
  }
  size_t size() const { return map_.size(); }

 private:
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> map_;
};

/// Merges adjacent symbols of `ids` by rank until no pair of `merges` is left (a min-heap of
/// candidates ordered by (rank, position)); `lens` (same size, may be null) holds each symbol's
/// byte length and is merged alongside. Source: HF tokenizers models/bpe/word.rs (merge_all).
void bpe_merge(const MergeTable& merges, std::vector<int32_t>& ids, std::vector<size_t>* lens);

/// Token texts matched whole in raw text before the model sees it.
class SpecialTokens {
 public:
  /// Registers `text` (non-empty) as token `id`.
  void add(const std::string& text, int32_t id);
  /// Sorts longest first (call once after the adds).
  void finalize();
  bool empty() const { return texts_.empty(); }
  /// Length of the longest token starting at text[i] and its id, or 0.
  size_t match(std::string_view text, size_t i, int32_t& id) const;

 private:
  std::vector<std::string> texts_;  // longest first after finalize()
  std::vector<int32_t> ids_;
  bool first_char_[256] = {};
};

}  // namespace dtr::tokenizer
