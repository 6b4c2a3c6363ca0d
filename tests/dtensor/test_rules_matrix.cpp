// mm / bmm / linear / matmul sharding: every placement combination equals the single-process
// result (forward and backward); Shard(1) x Shard(0) gives Partial with no communication.
#include "dtensor/comm_debug.h"
#include "dtensor_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Tensor rnd(const Shape& s) { return uniform(s, -1, 1, TensorOptions(DType::f64)); }
}

TEST_CASE("mm over all placement pairs", "[rules][matrix]") {
  manual_seed(21);
  Tensor a = rnd({5, 7}), b = rnd({7, 3});
  for (const DeviceMesh& mesh : test_meshes())
    for (const auto& pa : all_placements(mesh, 2, true))
      for (const auto& pb : all_placements(mesh, 2, true)) {
        const std::string r =
            compare_with_single([](const std::vector<Tensor>& v) { return mm(v[0], v[1]); }, {a, b}, mesh, {pa, pb});
        INFO(r);
        CHECK(r.empty());
      }
}

TEST_CASE("bmm and linear with sharded batch / sequence", "[rules][matrix]") {
  manual_seed(22);
  Tensor a = rnd({3, 5, 4}), b = rnd({3, 4, 2});
  Tensor x = rnd({2, 5, 4}), w = rnd({6, 4}), bias = rnd({6});
  for (const DeviceMesh& mesh : test_meshes()) {
    for (const auto& pa : all_placements(mesh, 3, false))
      for (const auto& pb : all_placements(mesh, 3, false)) {
        const std::string r =
            compare_with_single([](const std::vector<Tensor>& v) { return bmm(v[0], v[1]); }, {a, b}, mesh, {pa, pb});
        INFO(r);
        CHECK(r.empty());
      }
    for (const auto& px : all_placements(mesh, 3, false))
      for (const auto& pw : all_placements(mesh, 2, false)) {
        const std::string r = compare_with_single(
            [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); }, {x, w, bias}, mesh,
            {px, pw, Placements(mesh.ndim(), Replicate())});
        INFO(r);
        CHECK(r.empty());
      }
  }
}

TEST_CASE("mm of Shard(1) x Shard(0) is Partial without communication", "[rules][matrix][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor a = rnd({4, 6}), b = rnd({6, 5});
  Tensor da = distribute_tensor(a, mesh, {Shard(1)}), db = distribute_tensor(b, mesh, {Shard(0)});
  CommDebugMode m;
  Tensor c = mm(da, db);
  CHECK(m.total() == 0);
  if (mesh.size() > 1) CHECK(placements(c)[0].is_partial());
  CHECK(max_abs_diff(full_tensor(c), mm(a, b)) < kDistTol);
  // Colwise: R x S(1) -> S(1), no communication.
  CommDebugMode m2;
  Tensor d = mm(distribute_tensor(a, mesh, {Replicate()}), distribute_tensor(b, mesh, {Shard(1)}));
  CHECK(m2.total() == 0);
  CHECK(placements(d)[0] == Shard(1));
}
