// View rules: transpose / permute / expand / slice / view / reshape on sharded tensors equal the
// single process; a view that would need communication raises, reshape redistributes.
#include "dtensor/comm_debug.h"
#include "dtensor_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Tensor rnd(const Shape& s) { return uniform(s, -1, 1, TensorOptions(DType::f64)); }

void check_all(const std::function<Tensor(const std::vector<Tensor>&)>& f, const Tensor& x) {
  for (const DeviceMesh& mesh : test_meshes())
    for (const auto& p : all_placements(mesh, x.dim(), true)) {
      const std::string r = compare_with_single(f, {x}, mesh, {p});
      INFO(r);
      CHECK(r.empty());
    }
}
}  // namespace

TEST_CASE("transpose, permute, expand, slice", "[rules][view]") {
  manual_seed(41);
  Tensor x = rnd({5, 3, 4});
  check_all([](const std::vector<Tensor>& v) { return transpose(v[0], 0, 2); }, x);
  check_all([](const std::vector<Tensor>& v) { return permute(v[0], {1, 2, 0}); }, x);
  check_all([](const std::vector<Tensor>& v) { return narrow(v[0], 0, 1, 3); }, x);
  check_all([](const std::vector<Tensor>& v) { return slice(v[0], 2, 0, 4, 2); }, x);
  Tensor y = rnd({1, 3, 4});
  check_all([](const std::vector<Tensor>& v) { return expand(v[0], {2, 5, 3, 4}); }, y);
}

TEST_CASE("reshape flattens and splits sharded dims exactly", "[rules][view]") {
  manual_seed(42);
  Tensor x = rnd({4, 6, 2});
  check_all([](const std::vector<Tensor>& v) { return reshape(v[0], {24, 2}); }, x);
  check_all([](const std::vector<Tensor>& v) { return reshape(v[0], {4, 12}); }, x);
  check_all([](const std::vector<Tensor>& v) { return reshape(v[0], {2, 2, 3, 4}); }, x);
  check_all([](const std::vector<Tensor>& v) { return reshape(v[0], {-1}); }, x);
  check_all([](const std::vector<Tensor>& v) { return unsqueeze(v[0], 1); }, x);
  Tensor u = rnd({5, 3});  // uneven rows: flatten must gather
  check_all([](const std::vector<Tensor>& v) { return reshape(v[0], {15}); }, u);
}

TEST_CASE("view on a sharded dim that needs communication raises", "[rules][view][errors]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  if (mesh.size() == 1) return;
  Tensor x = distribute_tensor(rnd({4, 6}), mesh, {Shard(1)});
  CHECK_THROWS_WITH(view(x, {24}), Catch::Contains("use reshape"));
  CHECK(max_abs_diff(full_tensor(reshape(x, {24})), reshape(full_tensor(x), {24})) < kDistTol);
  // A view that keeps the shard on a leading dim is free.
  Tensor y = distribute_tensor(rnd({4 * mesh.size(), 6}), mesh, {Shard(0)});
  CommDebugMode m;
  Tensor z = view(y, {4 * mesh.size() * 6});
  CHECK(m.total() == 0);
  CHECK(placements(z)[0] == Shard(0));
}
