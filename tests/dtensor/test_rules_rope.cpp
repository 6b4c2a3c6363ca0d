// rotary_embedding sharding: x [B, H, T, D] sharded on batch, heads or sequence (cos/sin
// sliced locally), the rotated dim gathered; gradients of x and of the tables match.
#include "nn_rules_test_util.h"

using namespace dtr;
using namespace dtr::testing;

TEST_CASE("rotary_embedding over every placement of x and the tables", "[rules][rope]") {
  manual_seed(51);
  auto [c, s] = rope_tables(5, 4, 10000.0, 0, DType::f64);
  Tensor x = rnd({2, 3, 5, 4});
  check_all([](const std::vector<Tensor>& v) { return rotary_embedding(v[0], v[1], v[2]); }, {x, c, s},
            {any_placement(4, true), replicated(), replicated()});
  check_all([](const std::vector<Tensor>& v) { return rotary_embedding(v[0], v[1], v[2]); }, {x, c, s},
            {each_of({Shard(2), Shard(1)}), each_of({Shard(0), Replicate(), Shard(1)}),
             each_of({Shard(0), Replicate()})});
}

TEST_CASE("sequence-sharded rotary_embedding slices plain tables locally", "[rules][rope][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  auto [c, s] = rope_tables(5, 4, 10000.0, 3, DType::f64);
  Tensor x = rnd({2, 3, 5, 4});
  for (int64_t d : {0, 1, 2}) {
    Tensor dx = distribute_tensor(x, mesh, {Shard(d)});
    CommDebugMode m;
    Tensor y = rotary_embedding(dx, c, s);
    CHECK(m.total() == 0);
    CHECK(placements(y)[0] == Shard(d));
    CHECK(max_abs_diff(full_tensor(y), rotary_embedding(x, c, s)) < kDistTol);
  }
}
