// Reduction rules: sum / mean / amax / max over sharded and replicated dims equal the single
// process, including mean over an unevenly sharded dim; a reduced shard becomes Partial
// without communication.
#include "dtensor/comm_debug.h"
#include "dtensor_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Tensor rnd(const Shape& s) { return uniform(s, -1, 1, TensorOptions(DType::f64)); }

void check_all(const std::function<Tensor(const std::vector<Tensor>&)>& f, const Tensor& x, bool partial = true) {
  for (const DeviceMesh& mesh : test_meshes())
    for (const auto& p : all_placements(mesh, x.dim(), partial)) {
      const std::string r = compare_with_single(f, {x}, mesh, {p});
      INFO(r);
      CHECK(r.empty());
    }
}
}  // namespace

TEST_CASE("sum and mean over any dims", "[rules][reduction]") {
  manual_seed(31);
  Tensor x = rnd({5, 3, 2});  // 5 rows: uneven over 2, 3, 4 ranks
  for (const Shape& dims : {Shape{0}, Shape{1}, Shape{0, 2}, Shape{}})
    for (bool keep : {false, true}) {
      check_all([dims, keep](const std::vector<Tensor>& v) { return sum(v[0], dims, keep); }, x);
      check_all([dims, keep](const std::vector<Tensor>& v) { return mean(v[0], dims, keep); }, x);
    }
}

TEST_CASE("amax and max with indices", "[rules][reduction]") {
  manual_seed(32);
  Tensor x = rnd({6, 5});
  check_all([](const std::vector<Tensor>& v) { return amax(v[0], {1}); }, x);
  check_all([](const std::vector<Tensor>& v) { return amax(v[0], {0}, true); }, x);
  check_all([](const std::vector<Tensor>& v) { return max(v[0], 1).first; }, x);
  check_all([](const std::vector<Tensor>& v) { return max(v[0], 0, true).first; }, x);
}

TEST_CASE("mean over an unevenly sharded dim is exact", "[rules][reduction]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor x = rnd({7, 2});
  Tensor d = distribute_tensor(x, mesh, {Shard(0)});
  CHECK(max_abs_diff(full_tensor(mean(d, {0})), mean(x, {0})) < kDistTol);
  CHECK(max_abs_diff(full_tensor(mean(d)), mean(x)) < kDistTol);
  CommDebugMode m;
  Tensor s = sum(d, {0});
  CHECK(m.total() == 0);
  if (mesh.size() > 1) CHECK(placements(s)[0].is_partial());
}
