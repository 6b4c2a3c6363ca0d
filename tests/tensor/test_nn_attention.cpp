// scaled_dot_product_attention (flash-style kernels) against a naive reference that
// materialises the T x S scores: T != S, GQA, causal (bottom-right aligned) and not, sizes
// that are not multiples of the 64 x 64 blocks, non-contiguous inputs; backward against the
// reference's autograd and against finite differences; bad shapes.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "tensor/dispatch.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {

/// Naive attention: repeat kv heads, full scores, mask (key j visible from query i when
/// j <= i + S - T, and j > i + S - T - window with a sliding window), softmax, weighted sum.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, int64_t window = 0) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t g = Hq / Hkv;
  auto rep = [&](const Tensor& t) {
    return t.unsqueeze(2).expand({B, Hkv, g, S, t.size(3)}).reshape({B, Hq, S, t.size(3)});
  };
  Tensor s = mul(matmul(q, rep(k).transpose(-1, -2)), 1.0 / std::sqrt(static_cast<double>(D)));
  if (causal) {
    std::vector<uint8_t> m(static_cast<size_t>(T * S));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < S; ++j) m[i * S + j] = j > i + S - T || (window > 0 && j <= i + S - T - window);
    s = masked_fill(s, from_vector<uint8_t>(m, {T, S}), -std::numeric_limits<double>::infinity());
  }
  return matmul(softmax(s, -1), rep(v));
}

Tensor leaf(const Shape& s) { return randn(s, TensorOptions(DType::f64)).set_requires_grad(true); }

/// Compares forward and gradients (of sum(out * w)) of the kernel with the naive reference.
void compare_with_naive(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t S, int64_t D, bool causal,
                        int64_t window = 0) {
  INFO("B=" << B << " Hq=" << Hq << " Hkv=" << Hkv << " T=" << T << " S=" << S << " D=" << D << " causal=" << causal
            << " window=" << window);
  Tensor q = leaf({B, Hq, T, D}), k = leaf({B, Hkv, S, D}), v = leaf({B, Hkv, S, D});
  Tensor w = randn({B, Hq, T, D}, DType::f64);
  Tensor out = scaled_dot_product_attention(q, k, v, causal, std::nullopt, window);
  sum(mul(out, w)).backward();
  Tensor dq = q.grad(), dk = k.grad(), dv = v.grad();
  q.set_grad(Tensor());
  k.set_grad(Tensor());
  v.set_grad(Tensor());
  Tensor ref = naive_attention(q, k, v, causal, window);
  sum(mul(ref, w)).backward();
  CHECK(max_abs_diff(out, ref) < 1e-12);
  CHECK(max_abs_diff(dq, q.grad()) < 1e-11);
  CHECK(max_abs_diff(dk, k.grad()) < 1e-11);
  CHECK(max_abs_diff(dv, v.grad()) < 1e-11);
}

}  // namespace

TEST_CASE("sdpa hand-checked", "[attention]") {
  // one query, two keys: weights softmax(q.k / sqrt(D))
  Tensor q = from_vector<double>({1, 0}, {1, 1, 1, 2});
  Tensor k = from_vector<double>({1, 0, 0, 1}, {1, 1, 2, 2});
  Tensor v = from_vector<double>({10, 0, 0, 20}, {1, 1, 2, 2});
  const double a = std::exp(1 / std::sqrt(2.0)), p0 = a / (a + 1);
  auto y = scaled_dot_product_attention(q, k, v, false).to_vector<double>();
  CHECK(y[0] == Approx(10 * p0));
  CHECK(y[1] == Approx(20 * (1 - p0)));
  // causal with S > T bottom-right: the single query is the last position and sees both keys
  CHECK(scaled_dot_product_attention(q, k, v, true).to_vector<double>() == y);
  // explicit scale
  auto z = scaled_dot_product_attention(q, k, v, false, 0.0).to_vector<double>();
  CHECK(z == std::vector<double>{5, 10});
}

TEST_CASE("sdpa matches the naive reference", "[attention]") {
  manual_seed(13);
  for (bool causal : {true, false}) {
    compare_with_naive(1, 2, 2, 4, 4, 8, causal);
    compare_with_naive(2, 4, 2, 3, 5, 4, causal);      // GQA, S > T
    compare_with_naive(1, 6, 2, 70, 130, 16, causal);  // several blocks, partial blocks
    compare_with_naive(1, 2, 1, 129, 129, 8, causal);  // T = S just over two blocks
    compare_with_naive(1, 1, 1, 1, 65, 3, causal);     // decode step
  }
}

TEST_CASE("sdpa f32 kernels (dtr's GEMM per block) match the f64 naive reference", "[attention]") {
  // The f32 path runs its block products through cpu::gemm (f64 through Eigen): q / k / v as
  // [B, T, H, D] views transposed to [B, H, T, D] (the model's layout: row stride H * D), GQA,
  // partial query and key blocks, causal / full / sliding window.
  manual_seed(31);
  struct Case { int64_t B, Hq, Hkv, T, S, D; bool causal; int64_t window; };
  for (const Case& c : {Case{2, 6, 2, 70, 70, 16, true, 0}, Case{1, 4, 4, 130, 130, 8, false, 0},
                        Case{1, 3, 1, 100, 150, 12, true, 0}, Case{1, 2, 1, 90, 90, 8, true, 40}}) {
    INFO("T=" << c.T << " S=" << c.S << " causal=" << c.causal << " window=" << c.window);
    auto view32 = [](int64_t B, int64_t H, int64_t L, int64_t D) { return randn({B, L, H, D}).transpose(1, 2); };
    Tensor q = view32(c.B, c.Hq, c.T, c.D).detach(), k = view32(c.B, c.Hkv, c.S, c.D).detach();
    Tensor v = view32(c.B, c.Hkv, c.S, c.D).detach();
    REQUIRE(!q.is_contiguous());
    q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true);
    Tensor w = randn({c.B, c.Hq, c.T, c.D});
    Tensor out = scaled_dot_product_attention(q, k, v, c.causal, std::nullopt, c.window);
    sum(mul(out, w)).backward();
    Tensor q64 = q.detach().to(DType::f64).set_requires_grad(true), k64 = k.detach().to(DType::f64).set_requires_grad(true);
    Tensor v64 = v.detach().to(DType::f64).set_requires_grad(true);
    Tensor ref = naive_attention(q64, k64, v64, c.causal, c.window);
    sum(mul(ref, w.to(DType::f64))).backward();
    CHECK(max_abs_diff(out.to(DType::f64), ref) < 2e-5);
    CHECK(max_abs_diff(q.grad().to(DType::f64), q64.grad()) < 1e-4);
    CHECK(max_abs_diff(k.grad().to(DType::f64), k64.grad()) < 1e-4);
    CHECK(max_abs_diff(v.grad().to(DType::f64), v64.grad()) < 1e-4);
  }
}

TEST_CASE("sdpa with a sliding window matches the masked reference", "[attention]") {
  manual_seed(29);
  // Windows shorter and longer than a key block (128) and a query block (64), S > T (KV cache),
  // a window of 1 (each query sees itself only) and one longer than the sequence (no effect).
  compare_with_naive(1, 2, 1, 12, 12, 8, true, 5);
  compare_with_naive(2, 4, 2, 7, 20, 4, true, 3);
  compare_with_naive(1, 2, 2, 9, 9, 4, true, 1);
  compare_with_naive(1, 2, 1, 300, 300, 8, true, 130);
  compare_with_naive(1, 2, 1, 200, 330, 8, true, 70);
  compare_with_naive(1, 1, 1, 10, 10, 4, true, 64);
  auto f = [](const std::vector<Tensor>& x) {
    return scaled_dot_product_attention(x[0], x[1], x[2], true, std::nullopt, 3);
  };
  CHECK(gradcheck(f, {leaf({1, 2, 6, 4}), leaf({1, 1, 8, 4}), leaf({1, 1, 8, 4})}) == "");
  Tensor q = leaf({1, 1, 3, 4});
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, q, q, false, std::nullopt, 2), Catch::Contains("is_causal"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, q, q, true, std::nullopt, -1), Catch::Contains("negative"));
}

TEST_CASE("sdpa with T > S causal: rows without visible keys are 0", "[attention]") {
  manual_seed(17);
  const int64_t T = 6, S = 4;
  Tensor q = leaf({1, 2, T, 8}), k = leaf({1, 1, S, 8}), v = leaf({1, 1, S, 8});
  Tensor out = scaled_dot_product_attention(q, k, v, true);
  CHECK(out.narrow(2, 0, T - S).to_vector<double>() == std::vector<double>(2 * (T - S) * 8, 0.0));
  Tensor ref = naive_attention(q, k, v, true).narrow(2, T - S, S);
  CHECK(max_abs_diff(out.narrow(2, T - S, S), ref) < 1e-12);
  CHECK(gradcheck([](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true); },
                  {q, k, v}) == "");
}

TEST_CASE("sdpa backward matches finite differences", "[attention][grad]") {
  manual_seed(19);
  auto f = [](bool causal) {
    return [causal](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal); };
  };
  CHECK(gradcheck(f(true), {leaf({1, 4, 3, 4}), leaf({1, 2, 5, 4}), leaf({1, 2, 5, 4})}) == "");
  CHECK(gradcheck(f(false), {leaf({1, 4, 3, 4}), leaf({1, 2, 5, 4}), leaf({1, 2, 5, 4})}) == "");
  // v with a different head dim
  CHECK(gradcheck(f(true), {leaf({1, 2, 3, 4}), leaf({1, 1, 3, 4}), leaf({1, 1, 3, 2})}) == "");
  // non-contiguous: [B, T, H, D] tensors transposed to [B, H, T, D]
  CHECK(gradcheck(
            [](const std::vector<Tensor>& x) {
              return scaled_dot_product_attention(x[0].transpose(1, 2), x[1].transpose(1, 2), x[2].transpose(1, 2),
                                                  true);
            },
            {leaf({1, 3, 2, 4}), leaf({1, 4, 1, 4}), leaf({1, 4, 1, 4})}) == "");
  // empty query length
  CHECK(scaled_dot_product_attention(leaf({1, 2, 0, 4}), leaf({1, 2, 3, 4}), leaf({1, 2, 3, 4})).sizes() ==
        Shape{1, 2, 0, 4});
}

TEST_CASE("sdpa low precision keeps lse in f32", "[attention]") {
  manual_seed(23);
  Tensor q = randn({1, 2, 5, 8}), k = randn({1, 2, 5, 8}), v = randn({1, 2, 5, 8});
  auto outs = dispatch(OpCall{op_def("sdpa"), {to_dtype(q, DType::bf16), to_dtype(k, DType::bf16),
                                               to_dtype(v, DType::bf16)}, {true, 1.0 / std::sqrt(8.0)}});
  CHECK(outs[0].dtype() == DType::bf16);
  CHECK(outs[1].dtype() == DType::f32);
  Tensor ref = scaled_dot_product_attention(q, k, v, true);
  CHECK(max_abs_diff(to_dtype(outs[0], DType::f32), ref) < 5e-2);  // bf16 inputs and output rounding
}

TEST_CASE("sdpa errors", "[attention]") {
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({1, 3, 2, 4}), zeros({1, 2, 2, 4}), zeros({1, 2, 2, 4})),
                    Catch::Contains("Hq=3") && Catch::Contains("Hkv=2"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({1, 2, 2, 4}), zeros({1, 2, 2, 5}), zeros({1, 2, 2, 4})),
                    Catch::Contains("head dim"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({2, 4}), zeros({2, 4}), zeros({2, 4})),
                    Catch::Contains("[B, Hq, T, D]"));
}
