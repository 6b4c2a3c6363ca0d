// cat / split / chunk sharding: cat along a sharded dim gathers it, other shards follow when
// the inputs agree (R operands chunked locally), Partial(sum) inputs stay Partial; split and
// chunk (narrow views, slice rule) keep shards of other dims; backward narrows / pads.
#include "nn_rules_test_util.h"

using namespace dtr;
using namespace dtr::testing;

TEST_CASE("cat over every placement pair", "[rules][cat]") {
  manual_seed(101);
  check_all([](const std::vector<Tensor>& v) { return cat({v[0], v[1]}, 0); }, {rnd({5, 3}), rnd({2, 3})},
            {any_placement(2, true), any_placement(2, true)});
  check_all([](const std::vector<Tensor>& v) { return cat({v[0], v[1], v[2]}, -1); },
            {rnd({5, 3}), rnd({5, 1}), rnd({5, 2})},
            {any_placement(2, false), each_of({Shard(0), Replicate()}), any_placement(2, false)});
}

TEST_CASE("cat along an unsharded dim keeps the shard without communication", "[rules][cat][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor a = rnd({5, 3}), b = rnd({5, 2});
  Tensor da = distribute_tensor(a, mesh, {Shard(0)}), db = distribute_tensor(b, mesh, {Shard(0)});
  CommDebugMode m;
  Tensor c = cat({da, db}, 1);
  Tensor c2 = cat({da, b}, 1);  // a plain operand is chunked locally
  CHECK(m.total() == 0);
  CHECK(placements(c)[0] == Shard(0));
  CHECK(placements(c2)[0] == Shard(0));
  CHECK(max_abs_diff(full_tensor(c), cat({a, b}, 1)) < kDistTol);
  CHECK(max_abs_diff(full_tensor(c2), cat({a, b}, 1)) < kDistTol);
}

TEST_CASE("split and chunk of distributed tensors", "[rules][split]") {
  manual_seed(102);
  Tensor x = rnd({5, 7});
  for (int64_t d : {0, 1}) {
    check_all([d](const std::vector<Tensor>& v) { return chunk(v[0], 3, d)[1]; }, {x}, {any_placement(2, true)});
    check_all([d](const std::vector<Tensor>& v) {
      auto parts = split(v[0], 2, d);
      return cat({parts.back(), parts.front()}, d);
    }, {x}, {any_placement(2, false)});
  }
  DeviceMesh mesh = DeviceMesh::world("w");
  CommDebugMode m;
  auto parts = chunk(distribute_tensor(x, mesh, {Shard(0)}), 2, 1);
  CHECK(m.total() == 0);
  CHECK(placements(parts[0])[0] == Shard(0));
}
