#pragma once
// How sdpa_backward's CPU kernel splits the query blocks of a kv head into work items: a pure
// function of the shape (never of the thread count), so the result is the same on any machine.
#include <algorithm>
#include <cstdint>

namespace dtr::cpu::attention {

/// sdpa_backward splits the query blocks of a kv head over up to kMaxBackwardSplit work items
/// (each with its own dk / dv accumulators, added in a fixed order at the end) while there are
/// fewer than kMinBackwardItems items: one item per kv head left a thread idle (Gemma 3: one kv
/// head) and let each block product start its own parallel region.
inline constexpr int64_t kMinBackwardItems = 8;
inline constexpr int64_t kMaxBackwardSplit = 4;

/// Query chunks per kv head: none (1) with kMinBackwardItems kv items or more, else the fewest
/// that give that many items, plus one when that makes an odd item count even (9 equal items on
/// 2 threads wait 1 / 9 of the work for the last: SmolLM2's 3 kv heads at batch 1 get 4 chunks,
/// 12 items), at most kMaxBackwardSplit and the query blocks.
inline int64_t backward_split(int64_t kv_items, int64_t nqb) {
  if (kv_items == 0) return 1;
  const int64_t cap = std::clamp<int64_t>(nqb, 1, kMaxBackwardSplit);
  const int64_t split = std::clamp<int64_t>((kMinBackwardItems + kv_items - 1) / kv_items, 1, cap);
  return split > 1 && split < cap && kv_items * split % 2 != 0 ? split + 1 : split;
}

/// The item (of `split`) that takes query block qb: 0, 1, .., split - 1, split - 1, .., 0, 0, 1, ..
/// (causal: later blocks see more keys, so each item gets early and late ones).
inline int64_t query_chunk(int64_t qb, int64_t split) {
  const int64_t p = qb % (2 * split);
  return p < split ? p : 2 * split - 1 - p;
}

}  // namespace dtr::cpu::attention
