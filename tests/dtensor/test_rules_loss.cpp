// cross_entropy sharding: rows sharded (global mean over non-ignored tokens, uneven and
// ignore-heavy shards), classes sharded (loss parallel: no all_gather of the logits, MAX then
// SUM all_reduce), both on a 2-d mesh; forward and backward equal the single process.
#include "nn_rules_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Fn ce() {
  return [](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1], -100); };
}
}  // namespace

TEST_CASE("cross_entropy over every placement of logits and targets", "[rules][loss]") {
  manual_seed(81);
  Tensor logits = rnd({5, 6}, -3, 3);
  Tensor t = from_vector<int64_t>({2, -100, 5, 0, 3}, {5});
  check_all(ce(), {logits, t}, {any_placement(2, true), any_placement(1, false)});
  // Ignore-heavy: the first rows are all ignored, so early row shards hold no token.
  Tensor t2 = from_vector<int64_t>({-100, -100, -100, 4, 1}, {5});
  check_all(ce(), {logits, t2}, {any_placement(2, false), any_placement(1, false)});
  // Everything ignored: loss 0, gradient 0.
  Tensor t3 = from_vector<int64_t>({-100, -100, -100, -100, -100}, {5});
  check_all(ce(), {logits, t3}, {any_placement(2, false), replicated()});
}

TEST_CASE("loss parallel never gathers the logits", "[rules][loss][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  manual_seed(82);
  Tensor logits = rnd({4, 9}, -3, 3);
  Tensor t = from_vector<int64_t>({8, 0, -100, 4}, {4});
  Tensor dl = distribute_tensor(logits, mesh, {Shard(1)}).set_requires_grad(true);
  CommDebugMode m;
  Tensor loss = cross_entropy(dl, t, -100);
  CHECK(m.count(CommKind::all_gather) == 0);
  CHECK(m.count(CommKind::all_reduce) == (mesh.size() > 1 ? 2 : 0));
  CHECK(placements(loss)[0] == Replicate());
  loss.backward();
  CHECK(m.count(CommKind::all_gather) == 0);
  CHECK(placements(dl.grad())[0] == Shard(1));
  Tensor lr = logits.detach().clone().set_requires_grad(true);
  Tensor ref = cross_entropy(lr, t, -100);
  ref.backward();
  CHECK(std::abs(to_local(loss).item<double>() - ref.item<double>()) < kDistTol);
  CHECK(max_abs_diff(full_tensor(dl.grad()), lr.grad()) < kDistTol);
}

TEST_CASE("row-sharded cross_entropy reduces sum and count in one all_reduce", "[rules][loss][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor logits = rnd({5, 3});
  Tensor t = from_vector<int64_t>({0, -100, -100, 2, 1}, {5});
  Tensor dl = distribute_tensor(logits, mesh, {Shard(0)});
  CommDebugMode m;
  Tensor loss = cross_entropy(dl, t, -100);
  CHECK(m.total() == (mesh.size() > 1 ? 1 : 0));
  CHECK(std::abs(to_local(loss).item<double>() - cross_entropy(logits, t, -100).item<double>()) < kDistTol);
}

TEST_CASE("loss parallel in f32 and bf16 matches the single-process kernel", "[rules][loss][lowp]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  manual_seed(83);
  Tensor t = from_vector<int64_t>({8, 0, -100, 4, 2}, {5});
  for (DType dt : {DType::f32, DType::bf16}) {
    const double tol = dt == DType::f32 ? 1e-5 : 2e-2;
    Tensor logits = to_dtype(rnd({5, 9}, -3, 3), dt);
    for (const Placements& pl : {Placements{Shard(1)}, Placements{Shard(0)}}) {
      Tensor dl = distribute_tensor(logits, mesh, pl).set_requires_grad(true);
      Tensor loss = cross_entropy(dl, t, -100);
      loss.backward();
      Tensor lr = logits.detach().clone().set_requires_grad(true);
      Tensor ref = cross_entropy(lr, t, -100);
      ref.backward();
      CHECK(to_local(loss).dtype() == dt);
      CHECK(std::abs(to_local(loss).item<double>() - ref.item<double>()) < tol);
      CHECK(max_abs_diff(to_dtype(full_tensor(dl.grad()), DType::f64), to_dtype(lr.grad(), DType::f64)) < tol);
    }
  }
}

TEST_CASE("colwise lm_head into loss parallel: no all_gather of logits, equal to single process",
          "[rules][loss][tp]") {
  manual_seed(84);
  const int64_t B = 2, T = 3, E = 4, V = 7;
  Tensor h = rnd({B, T, E}), w = rnd({V, E});
  Tensor t = from_vector<int64_t>({1, 6, -100, 0, 3, 5}, {B * T});
  const Fn f = [=](const std::vector<Tensor>& a) {
    return cross_entropy(reshape(linear(a[0], a[1]), {B * T, V}), a[2], -100);
  };
  for (const DeviceMesh& mesh : test_meshes()) {
    Placements R(mesh.ndim(), Replicate()), col = R;
    col.back() = Shard(0);
    const std::string r = compare_with_single(f, {h, w, t}, mesh, {R, col, R});
    INFO(r);
    CHECK(r.empty());
    Tensor dh = make_input(h, mesh, R).set_requires_grad(true), dw = make_input(w, mesh, col).set_requires_grad(true);
    CommDebugMode m;
    Tensor loss = f({dh, dw, t});
    loss.backward();
    CHECK(m.count(CommKind::all_gather) == 0);
    CHECK(placements(dw.grad()) == col);
  }
}
