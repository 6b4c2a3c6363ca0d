// Reduction rules: sum / mean / amax / max / all / any over sharded and replicated dims equal
// the single process, including mean over an unevenly sharded dim and empty shards; a reduced
// shard becomes Partial without communication (Partial(min) / Partial(max) for all / any).
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

TEST_CASE("all and any over sharded bool tensors are a logical and / or", "[rules][reduction][logical]") {
  // Rows: one all-true row, one with a single false, one all-false, one with a single true, and
  // row 4 true / false alternating: a sum over ranks (PyTorch's rule for all / any) would give
  // counts, not and / or. 5 rows x 3: uneven and empty shards on 2-4 ranks.
  Tensor x = from_vector<double>({1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 1}, {5, 3});
  for (const DeviceMesh& mesh : test_meshes())
    for (const auto& p : all_placements(mesh, 2, false))
      for (const Shape& dims : {Shape{}, Shape{0}, Shape{1}})
        for (bool keep : {false, true})
          for (bool boolean : {true, false}) {
            const Tensor in = boolean ? gt(x, 0.5) : x;
            const std::string ra = compare_with_single(
                [dims, keep](const std::vector<Tensor>& v) { return all(v[0], dims, keep); }, {in}, mesh, {p}, false);
            const std::string rb = compare_with_single(
                [dims, keep](const std::vector<Tensor>& v) { return any(v[0], dims, keep); }, {in}, mesh, {p}, false);
            INFO("all: " << ra << " any: " << rb << " dims " << detail::cat(dims) << " keepdim " << keep);
            CHECK(ra.empty());
            CHECK(rb.empty());
          }
  // A reduced shard becomes Partial(min) / Partial(max) with no communication.
  DeviceMesh mesh = DeviceMesh::world("w");
  if (mesh.size() > 1) {
    Tensor d = distribute_tensor(gt(x, 0.5), mesh, {Shard(0)});
    CommDebugMode m;
    Tensor a = all(d, {0});
    Tensor o = any(d);
    CHECK(m.total() == 0);
    CHECK(placements(a)[0] == Partial(ReduceOp::MIN));
    CHECK(placements(o)[0] == Partial(ReduceOp::MAX));
    CHECK(full_tensor(a).to_vector<bool>() == std::vector<bool>{false, false, false});
    CHECK(full_tensor(o).item<bool>() == true);
    // A Partial(sum) input is reduced first: all(x1 + x2) is not all(x1) and all(x2).
    Tensor ones_i = ones({4}, DType::i64);
    Tensor ps = make_dtensor(mesh.coordinate(0) == 0 ? ones_i : zeros({4}, DType::i64),
                             DTensorSpec{mesh, {Partial()}, {4}, DType::i64});
    CHECK(full_tensor(all(ps)).item<bool>() == true);
  }
}
