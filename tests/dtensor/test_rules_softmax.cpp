// softmax / log_softmax sharding: every placement (Partial included) of an uneven input equals
// the single-process result forward and backward; a shard of the softmax dim is gathered, a
// shard of another dim stays local without communication.
#include "nn_rules_test_util.h"

using namespace dtr;
using namespace dtr::testing;

TEST_CASE("softmax and log_softmax over every placement", "[rules][softmax]") {
  manual_seed(31);
  Tensor x = rnd({5, 6}, -2, 2);
  for (int64_t d : {0, 1, -1}) {
    check_all([d](const std::vector<Tensor>& v) { return softmax(v[0], d); }, {x}, {any_placement(2, true)});
    check_all([d](const std::vector<Tensor>& v) { return log_softmax(v[0], d); }, {x}, {any_placement(2, true)});
  }
  Tensor y = rnd({3, 5, 4}, -2, 2);
  check_all([](const std::vector<Tensor>& v) { return softmax(v[0], 1); }, {y}, {any_placement(3, false)});
}

TEST_CASE("softmax keeps other shards local and gathers the softmax dim", "[rules][softmax][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor x = rnd({5, 6});
  Tensor d0 = distribute_tensor(x, mesh, {Shard(0)});
  CommDebugMode m;
  Tensor y = softmax(d0, 1);
  CHECK(m.total() == 0);
  CHECK(placements(y)[0] == Shard(0));
  Tensor d1 = distribute_tensor(x, mesh, {Shard(1)});
  Tensor z = log_softmax(d1, 1);
  CHECK(placements(z)[0] == Replicate());
  CHECK(max_abs_diff(full_tensor(z), log_softmax(x, 1)) < kDistTol);
}
