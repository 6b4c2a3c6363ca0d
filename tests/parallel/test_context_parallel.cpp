// Context-parallel ops (parallel/context_parallel.h) against the single process, cp = world size
// (1-4 ranks): the load-balanced split and its inverse, the global positions of a slice, the
// differentiable all-gather, and attention over all-gathered K/V (causal, sliding window,
// non-causal, GQA, document ids of packed rows): each rank's output slice and q / k / v gradients
// equal the slices of the full-sequence sdpa's.
#include <catch2/catch.hpp>

#include "parallel/context_parallel.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

// f64 inputs: the only difference from the single process is the order of the key blocks in the
// online softmax (prefixes of different lengths), a few ulps.
constexpr double kTol = 1e-12;

double max_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  return amax(abs(sub(a, b))).item<double>();
}

std::shared_ptr<ProcessGroup> cp_group() { return DeviceMesh::world("cp").group(0); }

}  // namespace

TEST_CASE("context_parallel_shard: chunks r and 2cp-1-r; unshard inverts it; positions are the global indices") {
  auto pg = cp_group();
  const int64_t P = pg->size(), r = pg->rank(), T = 24;  // 24 % (2 * {1, 2, 3, 4}) == 0
  Tensor x = reshape(arange(0, 2.0 * T * 3, 1, TensorOptions(DType::f64)), {2, T, 3});
  Tensor local = context_parallel_shard(x, 1, P, r);
  REQUIRE(local.sizes() == Shape{2, T / P, 3});
  const std::vector<int64_t> pos = context_parallel_positions(T / P, P, r);
  const std::vector<double> lv = local.contiguous().to_vector<double>();
  for (int64_t i = 0; i < T / P; ++i) CHECK(lv[i * 3] == pos[i] * 3);  // x[0, t, 0] = 3 t
  const int64_t c = T / (2 * P);
  CHECK(pos.front() == r * c);
  CHECK(pos.back() == (2 * P - r) * c - 1);
  CHECK(max_diff(context_parallel_unshard(local, 1, pg), x) == 0);
  if (P > 1) {
    CHECK_THROWS_WITH(context_parallel_shard(narrow(x, 1, 0, 2 * P + 1), 1, P, r),
                      Catch::Contains("not divisible by 2 * cp_size = " + std::to_string(2 * P)));
    CHECK_THROWS_WITH(context_parallel_positions(3, P, r), Catch::Contains("is odd"));
  }
}

TEST_CASE("all_gather_along: backward reduce-scatters the gradient") {
  auto pg = cp_group();
  const int64_t P = pg->size(), r = pg->rank();
  // Rank r's x [2, 3, 2] = r + index; loss = sum(gathered * w) with w the same on every rank:
  // d loss / d x = P * w's block r (every rank's loss uses every block).
  Tensor x = add(reshape(arange(0, 12, 1, TensorOptions(DType::f64)), {2, 3, 2}), static_cast<double>(r));
  x.set_requires_grad(true);
  Tensor g = all_gather_along(x, 1, pg);
  REQUIRE(g.sizes() == Shape{2, 3 * P, 2});
  for (int64_t j = 0; j < P; ++j)
    CHECK(max_diff(narrow(g, 1, 3 * j, 3).detach(), add(x.detach(), static_cast<double>(j - r))) == 0);
  Tensor w = reshape(arange(0, 12.0 * P, 1, TensorOptions(DType::f64)), {2, 3 * P, 2});
  sum(mul(g, w)).backward();
  CHECK(max_diff(x.grad(), mul(narrow(w, 1, 3 * r, 3), static_cast<double>(P))) == 0);
}

TEST_CASE("context_parallel_attention equals the full-sequence sdpa on every slice (forward, backward, GQA)") {
  auto pg = cp_group();
  const int64_t P = pg->size(), r = pg->rank(), B = 2, Hq = 4, Hkv = 2, T = 48, D = 8;
  struct Case {
    bool causal;
    int64_t window;
  };
  for (Case cs : {Case{true, 0}, Case{true, 7}, Case{false, 0}}) {
    INFO("causal " << cs.causal << " window " << cs.window << " cp " << P);
    manual_seed(7);  // the same full tensors on every rank
    const TensorOptions o(DType::f64);
    Tensor q = normal({B, Hq, T, D}, 0, 1, o), k = normal({B, Hkv, T, D}, 0, 1, o), v = normal({B, Hkv, T, D}, 0, 1, o);
    Tensor w = normal({B, Hq, T, D}, 0, 1, o);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    Tensor ref = scaled_dot_product_attention(q, k, v, cs.causal, std::nullopt, cs.window);
    sum(mul(ref, w)).backward();

    auto shard = [&](const Tensor& t) { return context_parallel_shard(t.detach(), 2, P, r).contiguous(); };
    Tensor ql = shard(q), kl = shard(k), vl = shard(v);
    for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
    Tensor out = context_parallel_attention(ql, kl, vl, pg, cs.causal, std::nullopt, cs.window);
    CHECK(max_diff(out.detach(), shard(ref)) <= kTol);
    sum(mul(out, shard(w))).backward();
    CHECK(max_diff(ql.grad(), shard(q.grad())) <= kTol);
    CHECK(max_diff(kl.grad(), shard(k.grad())) <= kTol);
    CHECK(max_diff(vl.grad(), shard(v.grad())) <= kTol);
  }
}

TEST_CASE("context_parallel_attention with document ids (packed rows) equals sdpa with the document mask") {
  auto pg = cp_group();
  const int64_t P = pg->size(), r = pg->rank(), B = 2, Hq = 4, Hkv = 2, T = 48, D = 8;
  // Row 0: documents of 5, 13, 20, 10 tokens; row 1: 30 tokens then 18 of padding (one more document).
  std::vector<int64_t> ids;
  for (auto lens : {std::vector<int64_t>{5, 13, 20, 10}, std::vector<int64_t>{30, 18}})
    for (size_t d = 0; d < lens.size(); ++d) ids.insert(ids.end(), lens[d], static_cast<int64_t>(d));
  const Tensor docs = from_vector<int64_t>(ids, {B, T});
  for (bool causal : {true, false}) {
    INFO("causal " << causal << " cp " << P);
    manual_seed(11);
    const TensorOptions o(DType::f64);
    Tensor q = normal({B, Hq, T, D}, 0, 1, o), k = normal({B, Hkv, T, D}, 0, 1, o), v = normal({B, Hkv, T, D}, 0, 1, o);
    Tensor w = normal({B, Hq, T, D}, 0, 1, o);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    SdpaMask mask;
    mask.q_document_ids = docs;
    Tensor ref = scaled_dot_product_attention(q, k, v, causal, std::nullopt, causal ? 9 : 0, mask);
    sum(mul(ref, w)).backward();

    auto shard = [&](const Tensor& t) { return context_parallel_shard(t.detach(), 2, P, r).contiguous(); };
    Tensor ql = shard(q), kl = shard(k), vl = shard(v);
    for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
    const Tensor dl = context_parallel_shard(docs, 1, P, r).contiguous();
    Tensor out = context_parallel_attention(ql, kl, vl, pg, causal, std::nullopt, causal ? 9 : 0, dl);
    CHECK(max_diff(out.detach(), shard(ref)) <= kTol);
    sum(mul(out, shard(w))).backward();
    CHECK(max_diff(ql.grad(), shard(q.grad())) <= kTol);
    CHECK(max_diff(kl.grad(), shard(k.grad())) <= kTol);
    CHECK(max_diff(vl.grad(), shard(v.grad())) <= kTol);
  }
}

TEST_CASE("context_parallel_attention: one-line errors") {
  auto pg = cp_group();
  if (pg->size() == 1) return;
  const TensorOptions o(DType::f64);
  Tensor q = zeros({1, 2, 3, 4}, o);
  CHECK_THROWS_WITH(context_parallel_attention(q, q, q, pg), Catch::Contains("local sequence length 3 is odd"));
  Tensor k = zeros({1, 2, 4, 4}, o);
  CHECK_THROWS_WITH(context_parallel_attention(k, q, q, pg), Catch::Contains("different local lengths"));
}
