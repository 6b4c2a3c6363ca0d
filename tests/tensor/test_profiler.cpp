// The op profiler's bytes moved and FLOPs (tensor/profiler.h), counted by hand for each rule:
// a new output, a view (nothing moves), an in-place op (read + write), mm's 2 M K N, the grouped
// GEMM ops' (grouped_mm, its fused SwiGLU form and its backward pair), sdpa's
// visible (query, key) pairs under the causal mask and its backward twice the forward.
#include <catch2/catch.hpp>

#include <map>

#include "tensor/ops.h"
#include "tensor/ops/nn_swiglu.h"
#include "tensor/profiler.h"
#include "tensor/random.h"

using namespace dtr;

namespace {
/// Bytes and FLOPs per op name of what `fn` dispatched.
template <class Fn>
std::map<std::string, OpProfileEntry> profile_of(Fn&& fn) {
  reset_op_profile();
  {
    OpProfilerScope prof;
    fn();
  }
  std::map<std::string, OpProfileEntry> m;
  for (const OpProfileEntry& e : op_profile()) m[e.name] = e;
  reset_op_profile();
  return m;
}
}  // namespace

TEST_CASE("op profiler: bytes of pointwise, view and in-place ops", "[profiler]") {
  Tensor a = randn({3, 5}), b = randn({3, 5});
  auto m = profile_of([&] {
    Tensor c = add(a, b);                 // reads 2 x 15 floats, writes 15
    Tensor v = view(c, {15});             // a view: 0
    Tensor e = mul(a, a.narrow(0, 0, 1));  // broadcast [1, 5]: reads 15 + 5 (narrow's view: 0), writes 15
    add_(c, b, 2.0);                      // in place: reads c and b, writes c
    (void)v, (void)e;
  });
  CHECK(m.at("add").bytes == 3 * 15 * 4);
  CHECK(m.at("add").flops == 0);
  CHECK(m.at("view").bytes == 0);
  CHECK(m.at("slice").bytes == 0);
  CHECK(m.at("mul").bytes == (15 + 5 + 15) * 4);
  CHECK(m.at("add_").bytes == 3 * 15 * 4);

  // embedding reads the 3 rows it gathers of the [10, 4] table, not the table.
  Tensor table = randn({10, 4});
  Tensor ids = from_vector<int64_t>({1, 7, 1}, {3});
  m = profile_of([&] { (void)embedding(ids, table); });
  CHECK(m.at("embedding").bytes == 3 * 8 + 2 * 3 * 4 * 4);
}

TEST_CASE("op profiler: FLOPs of mm and causal sdpa", "[profiler]") {
  Tensor x = randn({4, 6}), w = randn({6, 3});
  auto m = profile_of([&] { (void)mm(x, w); });
  CHECK(m.at("mm").flops == 2.0 * 4 * 6 * 3);
  CHECK(m.at("mm").bytes == (24 + 18 + 12) * 4);

  // B 2, Hq 4, Hkv 2, T = S = 5, D 8: causal pairs 1 + 2 + ... + 5 = 15 per head.
  Tensor q = randn({2, 4, 5, 8}).set_requires_grad(true), k = randn({2, 2, 5, 8}).set_requires_grad(true);
  Tensor v = randn({2, 2, 5, 8}).set_requires_grad(true);
  m = profile_of([&] { sum(scaled_dot_product_attention(q, k, v, true)).backward(); });
  const double fwd = 2.0 * 2 * 4 * 15 * (8 + 8);
  CHECK(m.at("sdpa").flops == fwd);
  CHECK(m.at("sdpa_backward").flops == 2 * fwd);
  // Non-causal: all 25 pairs. Sliding window 2: each query sees itself and the key before it (9 pairs).
  m = profile_of([&] { (void)scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), false); });
  CHECK(m.at("sdpa").flops == 2.0 * 2 * 4 * 25 * 16);
  m = profile_of([&] { (void)scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), true, {}, 2); });
  CHECK(m.at("sdpa").flops == 2.0 * 2 * 4 * 9 * 16);
}

TEST_CASE("op profiler: FLOPs of the grouped GEMM ops (grouped_mm, grouped_mm_swiglu, grouped_mm_pair)", "[profiler]") {
  // T 7 token copies in groups {3, 4}, K 4, N = 2I 6: each product 2 T K N; the backward of
  // grouped_mm with both operands requiring grad is one grouped_mm_pair (dA and dB: twice that).
  const Shape sizes{3, 4};
  Tensor x = randn({7, 4}).set_requires_grad(true), w = randn({2, 4, 6}).set_requires_grad(true);
  const double f = 2.0 * 7 * 4 * 6;
  auto m = profile_of([&] { sum(grouped_mm(x, w, sizes)).backward(); });
  CHECK(m.at("grouped_mm").flops == f);
  CHECK(m.at("grouped_mm_pair").flops == 2 * f);
  m = profile_of([&] { (void)grouped_mm_swiglu(x.detach(), w.detach(), sizes, randn({7})); });
  CHECK(m.at("grouped_mm_swiglu").flops == f);
}
