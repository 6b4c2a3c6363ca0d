// swiglu {gate, up} and swiglu_backward sharding (and geglu / geglu_backward, which use the
// same rules): every Shard / Replicate / Partial combination of
// the two inputs gives the single-process value and gradients (Partial is reduced first, the op is
// nonlinear); matching shards and the Llama tensor-parallel layout (both Shard(-1), colwise
// gate/up projections) run without communication, forward and backward.
#include "nn_rules_test_util.h"
#include "tensor/dispatch.h"
#include "tensor/ops/nn_swiglu.h"

using namespace dtr;
using namespace dtr::testing;

TEST_CASE("swiglu over every placement of gate and up", "[rules][swiglu]") {
  manual_seed(61);
  Tensor g = rnd({6, 5}, -4, 4), u = rnd({6, 5});
  const auto opts = each_of({Replicate(), Shard(0), Shard(1), Partial(ReduceOp::SUM)});
  check_all([](const std::vector<Tensor>& v) { return swiglu(v[0], v[1]); }, {g, u}, {opts, opts});
}

TEST_CASE("swiglu with matching shards needs no communication", "[rules][swiglu][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  manual_seed(62);
  Tensor g = rnd({4, 7}, -4, 4), u = rnd({4, 7});
  for (int64_t d : {0, 1}) {
    Tensor dg = distribute_tensor(g, mesh, {Shard(d)}), du = distribute_tensor(u, mesh, {Shard(d)});
    Tensor dgrad = distribute_tensor(ones({4, 7}, TensorOptions(DType::f64)), mesh, {Shard(d)});
    CommDebugMode m;
    Tensor y = swiglu(dg, du);
    auto grads = dispatch(OpCall{op_def("swiglu_backward"), {dgrad, dg, du}, {}});
    CHECK(m.total() == 0);
    CHECK(placements(y)[0] == Shard(d));
    REQUIRE(grads.size() == 2);
    CHECK(placements(grads[0])[0] == Shard(d));
    CHECK(placements(grads[1])[0] == Shard(d));
    CHECK(max_abs_diff(full_tensor(y), swiglu(g, u)) < kDistTol);
  }
}

TEST_CASE("geglu over every placement of gate and up; matching shards need no communication",
          "[rules][geglu][comm]") {
  manual_seed(63);
  Tensor g = rnd({6, 5}, -4, 4), u = rnd({6, 5});
  const auto opts = each_of({Replicate(), Shard(0), Shard(1), Partial(ReduceOp::SUM)});
  check_all([](const std::vector<Tensor>& v) { return geglu(v[0], v[1]); }, {g, u}, {opts, opts});
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor dg = distribute_tensor(g, mesh, {Shard(1)}), du = distribute_tensor(u, mesh, {Shard(1)});
  Tensor dgrad = distribute_tensor(ones({6, 5}, TensorOptions(DType::f64)), mesh, {Shard(1)});
  CommDebugMode m;
  Tensor y = geglu(dg, du);
  auto grads = dispatch(OpCall{op_def("geglu_backward"), {dgrad, dg, du}, {}});
  CHECK(m.total() == 0);
  CHECK(placements(y)[0] == Shard(1));
  REQUIRE(grads.size() == 2);
  CHECK(placements(grads[0])[0] == Shard(1));
  CHECK(placements(grads[1])[0] == Shard(1));
  CHECK(max_abs_diff(full_tensor(y), geglu(g, u)) < kDistTol);
}
