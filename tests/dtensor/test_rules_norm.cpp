// rms_norm sharding: rows sharded on any dim (sequence parallel Shard(1) included), the
// normalised dim gathered, Partial reduced; dweight arrives Replicate (reduced from Partial).
#include "nn_rules_test_util.h"

using namespace dtr;
using namespace dtr::testing;

TEST_CASE("rms_norm over every placement of x and weight", "[rules][norm]") {
  manual_seed(41);
  Tensor x = rnd({2, 5, 4}), w = rnd({4}, 0.5, 1.5);
  check_all([](const std::vector<Tensor>& v) { return rms_norm(v[0], v[1], 1e-6); }, {x, w},
            {any_placement(3, true), each_of({Replicate(), Shard(0)})});
  Tensor x2 = rnd({5, 3});
  check_all([](const std::vector<Tensor>& v) { return rms_norm(v[0], v[1], 1e-5); }, {x2, rnd({3}, 0.5, 1.5)},
            {any_placement(2, false), any_placement(1, true)});
}

TEST_CASE("sequence-parallel rms_norm stays local; dweight is reduced to Replicate", "[rules][norm][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor x = rnd({2, 5, 4}), w = rnd({4}, 0.5, 1.5);
  Tensor dx = distribute_tensor(x, mesh, {Shard(1)}).set_requires_grad(true);
  Tensor dw = distribute_tensor(w, mesh, {Replicate()}).set_requires_grad(true);
  CommDebugMode m;
  Tensor y = rms_norm(dx, dw, 1e-6);
  CHECK(m.total() == 0);
  CHECK(placements(y)[0] == Shard(1));
  sum(y).backward();
  CHECK(placements(dw.grad())[0] == Replicate());
  Tensor xr = x.detach().clone().set_requires_grad(true), wr = w.detach().clone().set_requires_grad(true);
  sum(rms_norm(xr, wr, 1e-6)).backward();
  CHECK(max_abs_diff(full_tensor(dw.grad()), wr.grad()) < kDistTol);
  CHECK(max_abs_diff(full_tensor(dx.grad()), xr.grad()) < kDistTol);
}
