// Pointwise sharding rules: forward and backward equal the single-process result for every
// combination of input placements (Partial included), with broadcasting and uneven sizes;
// the known hard cases (scalar + Partial, cache keyed by scalars) are checked explicitly.
#include "dtensor/comm_debug.h"
#include "dtensor/propagation.h"
#include "dtensor_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Tensor rnd(const Shape& s, double lo = -1, double hi = 1) { return uniform(s, lo, hi, TensorOptions(DType::f64)); }
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

void check_all(const Fn& f, const std::vector<Tensor>& fulls, bool partial = true) {
  for (const DeviceMesh& mesh : test_meshes()) {
    std::vector<std::vector<Placements>> combos{{}};
    for (const auto& t : fulls) {
      std::vector<std::vector<Placements>> next;
      for (const auto& c : combos)
        for (const auto& p : all_placements(mesh, t.dim(), partial)) {
          auto d = c;
          d.push_back(p);
          next.push_back(d);
        }
      combos = next;
    }
    for (const auto& c : combos) {
      const std::string r = compare_with_single(f, fulls, mesh, c);
      INFO(r);
      CHECK(r.empty());
    }
  }
}
}  // namespace

TEST_CASE("binary pointwise ops with broadcasting", "[rules][pointwise]") {
  manual_seed(11);
  check_all([](const std::vector<Tensor>& v) { return add(v[0], v[1]); }, {rnd({5, 3}), rnd({3})});
  check_all([](const std::vector<Tensor>& v) { return sub(v[0], v[1]); }, {rnd({5, 3}), rnd({5, 1})});
  check_all([](const std::vector<Tensor>& v) { return mul(v[0], v[1]); }, {rnd({3, 5}), rnd({3, 5})});
  check_all([](const std::vector<Tensor>& v) { return div(v[0], v[1]); }, {rnd({5, 3}), rnd({3}, 0.5, 2)});
}

TEST_CASE("unary pointwise ops", "[rules][pointwise]") {
  manual_seed(12);
  for (const Fn& f : std::vector<Fn>{[](const std::vector<Tensor>& v) { return silu(v[0]); },
                                     [](const std::vector<Tensor>& v) { return exp(mul(v[0], 0.5)); },
                                     [](const std::vector<Tensor>& v) { return neg(v[0]); },
                                     [](const std::vector<Tensor>& v) { return to_dtype(v[0], DType::f64); },
                                     [](const std::vector<Tensor>& v) { return gelu(v[0]); }})
    check_all(f, {rnd({5, 3})});
}

TEST_CASE("a scalar added to a Partial tensor is added once", "[rules][pointwise][partial]") {
  for (const DeviceMesh& mesh : test_meshes()) {
    Tensor full = rnd({4, 3});
    Tensor x = make_input(full, mesh, Placements(mesh.ndim(), Partial()));
    Tensor y = add(x, 1.5);
    CHECK(max_abs_diff(full_tensor(y), add(full, 1.5)) < kDistTol);
    Tensor z = rsub(x, 2.0);
    CHECK(max_abs_diff(full_tensor(z), rsub(full, 2.0)) < kDistTol);
    // mul by a scalar keeps Partial with no communication.
    CommDebugMode m;
    Tensor w = mul(x, 3.0);
    CHECK(m.total() == 0);
    CHECK(placements(w)[0].is_partial());
    CHECK(max_abs_diff(full_tensor(w), mul(full, 3.0)) < kDistTol);
  }
}

TEST_CASE("an integer Partial plus an integer tensor is exact", "[rules][pointwise][partial]") {
  // The replicated operand becomes Partial(sum) locally: floating values are scaled by 1/n,
  // integers stay on coordinate 0 (dividing them raised "unsupported dtype" before).
  for (const DeviceMesh& mesh : test_meshes()) {
    Tensor x = from_vector<int64_t>({1, 2, 3, 4, 5}, {5});
    Tensor d = distribute_tensor(x, mesh, Placements(mesh.ndim(), Shard(0)));
    Tensor s = sum(d);  // Partial(sum) on every mesh dim (Replicate on a size-1 one is fine too)
    Tensor y = add(s, from_vector<int64_t>({7}, {}));
    CHECK(full_tensor(y).item<int64_t>() == 22);
    Tensor z = sub(s, from_vector<int64_t>({20}, {}));
    CHECK(full_tensor(z).item<int64_t>() == -5);
    Tensor v = add(sum(d, {}, true), from_vector<int64_t>({1, 1, 1}, {3}));
    CHECK(full_tensor(v).to_vector<int64_t>() == std::vector<int64_t>{16, 16, 16});
    // Replicate -> Partial(sum) directly: the pending sum is the value itself.
    Tensor r = distribute_tensor(x, mesh, Placements(mesh.ndim(), Replicate()));
    Tensor p = redistribute(r, Placements(mesh.ndim(), Partial()));
    CHECK(full_tensor(p).to_vector<int64_t>() == x.to_vector<int64_t>());
  }
}

TEST_CASE("integer division and casts to integers of a Partial are exact (reduced first)",
          "[rules][pointwise][partial]") {
  // Each rank holds one element (a pending sum of terms 1 / 0.5): dividing or truncating every
  // term gave 0 on >= 2 ranks, the single process divides / truncates the sum.
  const int64_t w = world_size();
  for (const DeviceMesh& mesh : test_meshes()) {
    INFO(mesh.str());
    const Placements shard(mesh.ndim(), Shard(0));
    Tensor s = sum(distribute_tensor(from_vector<int64_t>(std::vector<int64_t>(w, 1), {w}), mesh, shard));
    CHECK(full_tensor(div(s, from_vector<int64_t>({2}, {}))).item<int64_t>() == w / 2);
    Tensor h = sum(distribute_tensor(full({w}, 0.5), mesh, shard));  // f32 pending sum w / 2
    CHECK(full_tensor(to_dtype(h, DType::i64)).item<int64_t>() == w / 2);
    // Floating division and casts stay linear: no reduction, the Partial survives.
    CHECK(placements(div(h, 2.0)) == placements(h));
    CHECK(placements(to_dtype(h, DType::f64)) == placements(h));
    CHECK(std::abs(full_tensor(div(h, 2.0)).item<double>() - 0.25 * static_cast<double>(w)) < 1e-12);
  }
}

TEST_CASE("ops differing only in a scalar do not share a cache entry", "[rules][cache]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor full = rnd({6, 2});
  Tensor x = make_input(full, mesh, {Shard(0)});
  Tensor a = add(x, 1.0);
  Tensor b = add(x, 2.0);
  CHECK(max_abs_diff(full_tensor(a), add(full, 1.0)) < kDistTol);
  CHECK(max_abs_diff(full_tensor(b), add(full, 2.0)) < kDistTol);
  // A cached decision is reused for the same arguments.
  const auto before = propagation_stats();
  Tensor c = add(x, 1.0);
  CHECK(propagation_stats().hits == before.hits + 1);
}

TEST_CASE("operands on different meshes raise", "[rules][errors]") {
  if (world_size() < 2) return;
  DeviceMesh m1 = DeviceMesh::world("w");
  DeviceMesh m2({world_size(), 1}, {"x", "y"});
  Tensor a = distribute_tensor(rnd({4}), m1, {Shard(0)});
  Tensor b = distribute_tensor(rnd({4}), m2, {Shard(0), Replicate()});
  CHECK_THROWS_WITH(add(a, b), Catch::Contains("different meshes"));
}

TEST_CASE("backward from a distributed loss mixing plain tensors", "[rules][grad]") {
  for (const DeviceMesh& mesh : test_meshes()) {
    Tensor full = rnd({4, 3});
    Tensor w = rnd({4, 3});
    Tensor x = distribute_tensor(full, mesh, Placements(mesh.ndim(), Shard(0)));
    x.set_requires_grad(true);
    Tensor y = redistribute(mul(x, 2.0), replicate_all(mesh.ndim()));
    Tensor loss = sum(mul(y, w));  // w is plain: treated as replicated
    loss.backward();
    CHECK(max_abs_diff(full_tensor(x.grad()), mul(w, 2.0)) < kDistTol);
    CHECK(ones_like(loss).is_distributed());
  }
}
