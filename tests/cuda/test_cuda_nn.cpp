// CUDA kernels of the nn ops against the CPU backend: fused RMSNorm (norm.cu), RoPE (rope.cu),
// embedding forward / backward (embedding.cu), fused cross-entropy (loss.cu), cat
// (shape_ops.cu); f32 and bf16, uneven sizes, non-contiguous inputs, forward and backward.
#include "cuda_test_util.h"

using namespace dtr;

namespace {

// bf16 through fused kernels: CPU and GPU both compute in f32 and round once, but their f32
// sums differ in order; a result near a bf16 rounding boundary then differs by one ulp
// (2^-8 relative); backward formulas subtract such terms: allow ~3 ulps.
constexpr double kBf16Tol = 3e-2;
// f32 fused reductions of up to ~1000 terms (CPU in f64, GPU f32 trees): RMSNorm's dweight sums
// 1031 rows of |g x r| ~ 1, where cancellation leaves results near 0 with f32 error ~1e-5.
constexpr double kF32Tol = 5e-5;

Tensor leaf(const Shape& shape, DType dt, double lo = -2.0, double hi = 2.0) {
  return uniform(shape, lo, hi, TensorOptions(DType::f32)).to(dt).set_requires_grad(true);
}
double tol(DType dt) { return dt == DType::bf16 ? kBf16Tol : kF32Tol; }

}  // namespace

TEST_CASE("cuda rms_norm forward and backward match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Shape& shape : {Shape{1, 64}, Shape{7, 1031}, Shape{1031, 64}, Shape{2, 3, 96}, Shape{5, 1}}) {
      INFO("dtype " << dt << " shape " << detail::cat(shape));
      const Tensor x = leaf(shape, dt), w = leaf({shape.back()}, dt, 0.5, 1.5);
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{rms_norm(in[0], in[1], 1e-6)}; }, {x, w},
          tol(dt), tol(dt));
    }
    INFO("dtype " << dt << " non-contiguous x");
    const Tensor x = leaf({64, 7}, dt), w = leaf({64}, dt, 0.5, 1.5);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{rms_norm(in[0].transpose(0, 1), in[1], 1e-5)}; },
        {x, w}, tol(dt), tol(dt));
  }
}

TEST_CASE("cuda rotary_embedding forward and backward match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    const int64_t B = 2, H = 3, T = 7, D = 16;
    auto [c, s] = rope_tables(T, D, 10000.0, 0, dt);
    const Tensor x = leaf({B, H, T, D}, dt);
    // Tables as [T, D], as [1, 1, T, D], and requiring grad (gradient through sum_to).
    const Tensor c4 = reshape(c, {1, 1, T, D}), s4 = reshape(s, {1, 1, T, D});
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{rotary_embedding(in[0], in[1], in[2]), rotary_embedding(in[0], in[3], in[4])};
        },
        {x, c, s, c4, s4}, tol(dt), tol(dt));
    const Tensor cg = c.detach().clone().set_requires_grad(true), sg = s.detach().clone().set_requires_grad(true);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          // x as a transposed view [B, H, T, D] of a [B, T, H, D] tensor (non-contiguous).
          return std::vector<Tensor>{rotary_embedding(in[0].transpose(1, 2), in[1], in[2])};
        },
        {leaf({B, T, H, D}, dt), cg, sg}, tol(dt), tol(dt));
  }
}

TEST_CASE("cuda embedding forward and backward match the CPU (backward exact in f32)", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (DType it : {DType::i64, DType::i32}) {
      INFO("dtype " << dt << " ids " << it);
      // 1031 ids over a vocab of 50: every row repeats (scatter-add), some rows never occur.
      const Tensor ids = to_dtype(uniform({1031}, 0, 40), it);
      const Tensor w = leaf({50, 33}, dt);
      // Same summation order as the CPU (increasing position, f32): identical results.
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{embedding(in[0], in[1])}; }, {ids, w}, 0.0,
          0.0);
      const Tensor ids2 = to_dtype(uniform({7, 3}, 0, 50), it);
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{embedding(in[0], in[1])}; }, {ids2, w}, 0.0,
          0.0);
    }
    INFO("dtype " << dt << " strided weight");
    const Tensor wt = leaf({33, 50}, dt);
    const Tensor ids = to_dtype(uniform({7}, 0, 50), DType::i64);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{embedding(in[0], in[1].transpose(0, 1))}; },
        {ids, wt}, 0.0, 0.0);
  }
}

TEST_CASE("cuda embedding rejects out-of-range ids", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Tensor w = randn({10, 4}).to(testing::cuda_device());
  const Tensor bad = from_vector<int64_t>({1, 2, 10}, {3}).to(testing::cuda_device());
  CHECK_THROWS_WITH(embedding(bad, w), Catch::Contains("out of range"));
  const Tensor neg = from_vector<int64_t>({-1}, {1}).to(testing::cuda_device());
  CHECK_THROWS_WITH(embedding(neg, w), Catch::Contains("out of range"));
}

TEST_CASE("cuda cross_entropy forward and backward match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t C : {1, 49, 1031}) {
      INFO("dtype " << dt << " classes " << C);
      const int64_t N = 7;
      const Tensor logits = leaf({N, C}, dt, -5.0, 5.0);
      std::vector<int64_t> t(N);
      for (int64_t i = 0; i < N; ++i) t[i] = (i * 13) % C;
      t[2] = -100;  // ignored
      const Tensor targets = from_vector<int64_t>(t, {N});
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{cross_entropy(in[0], in[1])}; },
          {logits, targets}, tol(dt), tol(dt));
      // int32 targets, a custom ignore_index, non-contiguous logits.
      const Tensor lt = leaf({C, N}, dt, -5.0, 5.0);
      std::vector<int64_t> t0 = t;
      t0[2] = 0;  // ignored under ignore_index 0 (-100 would be out of range there)
      t0[4] = 0;
      const Tensor t32 = to_dtype(from_vector<int64_t>(t0, {N}), DType::i32);
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{cross_entropy(in[0].transpose(0, 1), in[1], 0)};
          },
          {lt, t32}, tol(dt), tol(dt));
    }
  }
}

TEST_CASE("cuda cross_entropy with every target ignored is 0 with zero gradient", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Tensor logits = leaf({3, 5}, DType::f32);
  const Tensor targets = from_vector<int64_t>({-100, -100, -100}, {3});
  testing::check_cuda_matches_cpu(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{cross_entropy(in[0], in[1])}; },
      {logits, targets}, 0.0, 0.0);
}

TEST_CASE("cuda cross_entropy rejects out-of-range targets", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Tensor logits = randn({2, 5}).to(testing::cuda_device());
  const Tensor bad = from_vector<int64_t>({1, 5}, {2}).to(testing::cuda_device());
  CHECK_THROWS_WITH(cross_entropy(logits, bad), Catch::Contains("out of range"));
}

TEST_CASE("cuda cat matches the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    const Tensor a = leaf({7, 5}, dt), b = leaf({7, 3}, dt), c = leaf({5, 7}, dt);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          const Tensor ct = in[2].transpose(0, 1);  // [7, 5] non-contiguous
          return std::vector<Tensor>{cat({in[0], in[1], ct}, 1), cat({in[0], ct}, 0), cat({in[0]}, -1)};
        },
        {a, b, c}, 0.0, 0.0);
  }
}
