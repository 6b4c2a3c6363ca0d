// CUDA reduction kernels (tensor/ops/cuda/reduction.cu) against the CPU backend: sum / mean /
// amax / all / any over every kind of dim set (last, leading block, middle, several, all; keepdim),
// max / argmax along a dim with ties, long reductions that take the split (two-pass) paths,
// non-contiguous inputs; f32 and bf16; forward and backward.
#include "cuda_test_util.h"

using namespace dtr;

namespace {

// f32: the CPU sums in f64, CUDA in f32 trees; over up to 1e5 terms of |x| <= 2 the f32 sum is
// off by ~1e-7 * sqrt(n) * max|partial| ~ 1e-4 absolute on sums of size ~300: rtol 1e-5 covers it
// for all but cancelling sums, hence the atol.
constexpr double kF32SumAtol = 1e-3;
constexpr double kF32SumRtol = 1e-5;

Tensor leaf(const Shape& shape, DType dt) {
  return uniform(shape, -2.0, 2.0, TensorOptions(DType::f32)).to(dt).set_requires_grad(true);
}

double atol_sum(DType dt) { return dt == DType::f32 ? kF32SumAtol : testing::atol_for(dt); }
double rtol_sum(DType dt) { return dt == DType::f32 ? kF32SumRtol : testing::rtol_for(dt); }

}  // namespace

TEST_CASE("cuda sum / mean / amax over dims match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  struct Case {
    Shape shape;
    Shape dims;
    bool keepdim;
  };
  const std::vector<Case> cases = {
      {{1031}, {}, false},        {{1}, {0}, true},          {{7, 1031}, {1}, false},   {{7, 1031}, {0}, true},
      {{7, 1031}, {}, false},     {{3, 5, 7}, {1}, false},   {{3, 5, 7}, {0, 2}, true}, {{3, 5, 7}, {0, 1}, false},
      {{3, 5, 7}, {-1}, true},    {{2, 3, 5, 7}, {1, 3}, false}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : cases) {
      INFO("dtype " << dt << " shape " << detail::cat(c.shape) << " dims " << detail::cat(c.dims) << " keepdim " << c.keepdim);
      const Tensor x = leaf(c.shape, dt);
      const Shape dims = c.dims;
      const bool keep = c.keepdim;
      testing::check_cuda_matches_cpu(
          [dims, keep](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{sum(in[0], dims, keep), mean(in[0], dims, keep)};
          },
          {x}, atol_sum(dt), rtol_sum(dt));
      testing::check_cuda_matches_cpu(
          [dims, keep](const std::vector<Tensor>& in) { return std::vector<Tensor>{amax(in[0], dims, keep)}; }, {x},
          testing::atol_for(dt), testing::rtol_for(dt));
    }
  }
}

TEST_CASE("cuda long reductions take the split paths and match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    // One row of 100003 (row split), 5003 x 3 over the leading dim (column split), 2 x 50001.
    for (const Shape& shape : {Shape{100003}, Shape{5003, 3}, Shape{2, 50001}}) {
      INFO("shape " << detail::cat(shape));
      const Tensor x = leaf(shape, dt);
      const Shape dims = shape.size() == 1 ? Shape{} : (shape[0] > shape[1] ? Shape{0} : Shape{1});
      testing::check_cuda_matches_cpu(
          [dims](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{sum(in[0], dims), amax(in[0], dims)};
          },
          {x}, dt == DType::f32 ? 1e-2 : testing::atol_for(dt), dt == DType::f32 ? 1e-5 : testing::rtol_for(dt));
    }
  }
}

TEST_CASE("cuda reductions of non-contiguous inputs match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    const Tensor x = leaf({33, 7, 5}, dt);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          const Tensor t = in[0].permute({2, 0, 1});  // [5, 33, 7]
          return std::vector<Tensor>{sum(t, {0}), sum(t, {2}, true), amax(t, {1}), sum(slice(in[0], 0, 0, 33, 4), {0})};
        },
        {x}, atol_sum(dt), rtol_sum(dt));
  }
}

TEST_CASE("cuda max / argmax along a dim match the CPU, first index on ties", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    // Coarse values: many ties, so the index rule (first maximum) is exercised.
    const Tensor x = to_dtype(to_dtype(uniform({7, 1031}, 0, 4), DType::i64), DType::f32).to(dt).set_requires_grad(true);
    for (int64_t d : {0, 1}) {
      for (bool keep : {false, true}) {
        INFO("dim " << d << " keepdim " << keep);
        testing::check_cuda_matches_cpu(
            [d, keep](const std::vector<Tensor>& in) {
              auto [v, i] = max(in[0], d, keep);
              return std::vector<Tensor>{v, i, argmax(in[0], d, keep), amax(in[0], {d}, keep)};
            },
            {x}, 0.0, 0.0);
      }
    }
    const Tensor y = leaf({1, 1031}, dt);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          auto [v, i] = max(in[0].transpose(0, 1), 0);
          return std::vector<Tensor>{v, i};
        },
        {y}, 0.0, 0.0);
  }
}

TEST_CASE("cuda all / any match the CPU on every dtype, dim set and empty reductions", "[cuda]") {
  DTR_REQUIRE_CUDA();
  struct Case {
    Shape shape;
    Shape dims;
    bool keepdim;
  };
  // Long rows (more than one block of threads per row), leading / middle / all dims, empty dims.
  const std::vector<Case> cases = {{{1031}, {}, false},     {{7, 1031}, {1}, false}, {{7, 1031}, {0}, true},
                                   {{3, 5, 7}, {0, 2}, true}, {{3, 5, 7}, {1}, false}, {{4, 0}, {1}, false},
                                   {{0, 4}, {1}, true},       {{4, 0}, {}, false}};
  for (DType dt : {DType::f32, DType::bf16, DType::i64, DType::bool_})
    for (const Case& c : cases) {
      INFO("dtype " << dt << " shape " << detail::cat(c.shape) << " dims " << detail::cat(c.dims));
      // About one element in ten is zero: rows differ, some are all nonzero.
      Tensor x = to_dtype(gt(uniform(c.shape, 0.0, 1.0, TensorOptions(DType::f32)), 0.1), dt);
      if (dt == DType::f32) x = mul(x, uniform(c.shape, -2.0, 2.0, TensorOptions(DType::f32)));
      const Shape dims = c.dims;
      const bool keep = c.keepdim;
      testing::check_cuda_matches_cpu(
          [dims, keep](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{all(in[0], dims, keep), any(in[0], dims, keep)};
          },
          {x}, 0.0, 0.0, false);
    }
}
