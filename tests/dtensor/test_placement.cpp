// Placement arithmetic: torch.chunk sizes, nested uneven sharding offsets, normalisation.
#include <catch2/catch.hpp>

#include "dtensor/placement.h"

using namespace dtr;

TEST_CASE("chunk_of follows torch.chunk with empty trailing shards", "[placement]") {
  // 5 rows over 4 ranks: ceil = 2 -> 2, 2, 1, 0; the empty shard's offset is the size.
  CHECK(chunk_of(5, 4, 0).size == 2);
  CHECK(chunk_of(5, 4, 2).size == 1);
  CHECK(chunk_of(5, 4, 2).offset == 4);
  CHECK(chunk_of(5, 4, 3).size == 0);
  CHECK(chunk_of(5, 4, 3).offset == 5);
  CHECK(chunk_of(0, 3, 1).size == 0);
}

TEST_CASE("nested sharding on a 2-d mesh differs from 1-d (pytorch#160835)", "[placement]") {
  // [S0] on 8 ranks vs [S0, S0] on (2, 4) with 5 rows: 1,1,1,1,1,0,0,0 vs 1,1,1,0,1,1,0,0.
  std::vector<int64_t> flat, nested;
  for (int64_t r = 0; r < 8; ++r) {
    Shape ls, off;
    local_shape_and_offset({5, 3}, {8}, {Shard(0)}, {r}, ls, off);
    flat.push_back(ls[0]);
    local_shape_and_offset({5, 3}, {2, 4}, {Shard(0), Shard(0)}, {r / 4, r % 4}, ls, off);
    nested.push_back(ls[0]);
  }
  const std::vector<int64_t> want_flat{1, 1, 1, 1, 1, 0, 0, 0}, want_nested{1, 1, 1, 0, 1, 1, 0, 0};
  CHECK(flat == want_flat);
  CHECK(nested == want_nested);
  // Offsets of the nested layout: rows 0,1,2,(empty),3,4,(empty),(empty).
  std::vector<int64_t> offs;
  for (int64_t r = 0; r < 8; ++r) {
    Shape ls, off;
    local_shape_and_offset({5, 3}, {2, 4}, {Shard(0), Shard(0)}, {r / 4, r % 4}, ls, off);
    offs.push_back(off[0]);
  }
  const std::vector<int64_t> want_offs{0, 1, 2, 5, 3, 4, 5, 5};
  CHECK(offs == want_offs);
}

TEST_CASE("shard dims of different tensor dims compose", "[placement]") {
  Shape ls, off;
  local_shape_and_offset({7, 5}, {2, 3}, {Shard(1), Shard(0)}, {1, 2}, ls, off);
  // dim 1: chunk(5, 2)[1] = 2 cols at 3; dim 0: chunk(7, 3)[2] = 1 row at 6.
  CHECK(ls == Shape{1, 2});
  CHECK(off == Shape{6, 3});
}

TEST_CASE("negative shard dims are normalised; out of range raises", "[placement]") {
  Placements p = normalize_placements({Shard(-1), Replicate()}, 3, "test");
  CHECK(p[0] == Shard(2));
  CHECK_THROWS_WITH(normalize_placements({Shard(3)}, 3, "test"), Catch::Contains("Shard(3)") && Catch::Contains("3-d"));
  CHECK(Partial(ReduceOp::MAX) != Partial(ReduceOp::SUM));
  CHECK(Shard(0).str() == "Shard(0)");
}
