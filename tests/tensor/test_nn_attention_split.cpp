// tensor/ops/cpu/nn_attention_split.h: sdpa_backward's work items per kv head, worked by hand from
// the rule (>= kMinBackwardItems items, an odd item count made even when the cap allows, at most
// kMaxBackwardSplit and the query blocks) and the query blocks' zigzag over the chunks.
#include <catch2/catch.hpp>
#include <vector>

#include "tensor/ops/cpu/nn_attention_split.h"

using dtr::cpu::attention::backward_split;
using dtr::cpu::attention::query_chunk;

TEST_CASE("sdpa_backward split: chunks per kv head by shape", "[attention]") {
  CHECK(backward_split(0, 16) == 1);   // no items
  CHECK(backward_split(12, 16) == 1);  // SmolLM2 batch 4: 3 kv heads x 4 rows, enough items
  CHECK(backward_split(8, 16) == 1);
  CHECK(backward_split(3, 16) == 4);   // SmolLM2 batch 1: 3 chunks give 9 items (odd) -> 4, 12 items
  CHECK(backward_split(1, 16) == 4);   // Gemma 3 batch 1: one kv head, capped at kMaxBackwardSplit
  CHECK(backward_split(2, 16) == 4);   // 8 items
  CHECK(backward_split(5, 16) == 2);   // 10 items, even
  CHECK(backward_split(7, 16) == 2);   // 14 items
  CHECK(backward_split(3, 3) == 3);    // 9 items stay odd: 4 chunks exceed the 3 query blocks
  CHECK(backward_split(1, 2) == 2);    // capped by the query blocks
  CHECK(backward_split(1, 1) == 1);    // one query block: nothing to split
}

TEST_CASE("sdpa_backward split: query blocks zigzag over the chunks", "[attention]") {
  std::vector<int64_t> got;
  for (int64_t qb = 0; qb < 10; ++qb) got.push_back(query_chunk(qb, 3));
  CHECK(got == std::vector<int64_t>{0, 1, 2, 2, 1, 0, 0, 1, 2, 2});
  for (int64_t qb = 0; qb < 5; ++qb) CHECK(query_chunk(qb, 1) == 0);
  // Every chunk of a split gets the same number of blocks over a whole period of 2 x split.
  for (int64_t split = 1; split <= 4; ++split) {
    std::vector<int> count(static_cast<size_t>(split), 0);
    for (int64_t qb = 0; qb < 2 * split; ++qb) ++count[static_cast<size_t>(query_chunk(qb, split))];
    for (int c : count) CHECK(c == 2);
  }
}
