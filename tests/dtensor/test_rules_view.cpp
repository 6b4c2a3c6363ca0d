// View rules: transpose / permute / expand / slice / view / reshape on sharded tensors equal the
// single process; a view that would need communication raises, reshape redistributes; views of
// tensors sharded on a size-1 dim (unsqueeze / squeeze / view) and of empty tensors work.
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

TEST_CASE("views of a tensor sharded on a size-1 dim equal the single process", "[rules][view]") {
  // Every placement (Shard of the size-1 dims included) on 1-4 ranks; these raised "cannot
  // view ... without communication" or gave a shape error before.
  manual_seed(43);
  using V = std::vector<Tensor>;
  Tensor a = rnd({1, 4});
  check_all([](const V& v) { return unsqueeze(v[0], 0); }, a);
  check_all([](const V& v) { return unsqueeze(v[0], 1); }, a);
  check_all([](const V& v) { return unsqueeze(v[0], 2); }, a);
  check_all([](const V& v) { return squeeze(v[0], 0); }, a);
  check_all([](const V& v) { return view(v[0], {4, 1}); }, a);
  check_all([](const V& v) { return reshape(v[0], {1, 1, 2, 2}); }, a);
  check_all([](const V& v) { return reshape(v[0], {2, 2}); }, a);
  Tensor b = rnd({3, 1, 2});
  check_all([](const V& v) { return squeeze(v[0], 1); }, b);
  check_all([](const V& v) { return unsqueeze(v[0], 0); }, b);
  check_all([](const V& v) { return view(v[0], {3, 2, 1}); }, b);
  check_all([](const V& v) { return reshape(v[0], {6}); }, b);
  // max along a dim whose output keeps a sharded size-1 dim: backward unsqueezes the gradient.
  Tensor c = rnd({3, 1});
  check_all([](const V& v) { return max(v[0], 0).first; }, c);
  check_all([](const V& v) { return max(v[0], 1).first; }, c);
  check_all([](const V& v) { return max(v[0], 0, true).first; }, c);
  // Empty tensors: nothing to move, every view works.
  Tensor e = rnd({2, 0, 3});
  check_all([](const V& v) { return view(v[0], {0, 6}); }, e);
  check_all([](const V& v) { return unsqueeze(v[0], 1); }, e);
}

TEST_CASE("a view that keeps a size-1 shard needs no communication", "[rules][view]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor x = distribute_tensor(rnd({1, 4}), mesh, {Shard(0)});
  CommDebugMode m;
  Tensor y = unsqueeze(x, 0);
  Tensor z = view(x, {4, 1});
  CHECK(m.total() == 0);
  CHECK(placements(y)[0] == Shard(0));
  CHECK(placements(z)[0] == Shard(1));
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
