// cuBLASLt GEMM against the CPU backend: mm / bmm / matmul / linear for f64, f32, bf16, f16,
// every combination of transposed operands, misaligned views, batch-broadcast weights, the
// bias epilogue, TF32 opt-in, empty inner dimension, addmm_; forward and backward.
#include "cuda_test_util.h"
#include "tensor/ops/cuda/gemm.h"

using namespace dtr;

namespace {

const std::vector<DType> kFloat = {DType::f64, DType::f32, DType::bf16, DType::f16};

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

/// A [r, c] operand holding random values, stored either row-major or as the transpose of a
/// row-major [c, r] tensor (a column-major view).
Tensor operand(int64_t r, int64_t c, bool transposed, DType dt) {
  if (!transposed) return randn({r, c}, TensorOptions(dt).with_requires_grad());
  // A leaf that is a transposed view: make the [c, r] leaf and pass its transpose in f.
  return randn({c, r}, TensorOptions(dt).with_requires_grad());
}

/// Tolerance for a GEMM of inner size k with N(0,1) inputs: outputs are ~sqrt(k) in size, so
/// the absolute tolerance scales with sqrt(k) (f32: different summation order; bf16 / f16:
/// one rounding of the output, whose ulp grows with its magnitude).
double gemm_atol(DType dt, int64_t k) { return testing::atol_for(dt) * std::sqrt(static_cast<double>(k)); }

}  // namespace

TEST_CASE("gemm: mm with every transpose combination, every floating dtype", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const int64_t m = 33, k = 47, n = 29;  // odd sizes: no dimension a multiple of 8
  for (DType dt : kFloat) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        INFO(dtype_name(dt) << " transposed a " << ta << " b " << tb);
        const Tensor a = operand(m, k, ta, dt), b = operand(k, n, tb, dt);
        const Fn f = [ta, tb](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{mm(ta ? in[0].t() : in[0], tb ? in[1].t() : in[1])};
        };
        testing::check_cuda_matches_cpu(f, {a, b}, gemm_atol(dt, k), testing::rtol_for(dt));
      }
    }
  }
}

TEST_CASE("gemm: bmm with transposed batches and batch-broadcast operands", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const int64_t B = 3, m = 17, k = 24, n = 9;
  for (DType dt : kFloat) {
    INFO(dtype_name(dt));
    const double atol = gemm_atol(dt, k), rtol = testing::rtol_for(dt);
    const Tensor a = randn({B, m, k}, TensorOptions(dt).with_requires_grad());
    const Tensor bt = randn({B, n, k}, TensorOptions(dt).with_requires_grad());
    const Tensor w = randn({k, n}, TensorOptions(dt).with_requires_grad());
    const Tensor at = randn({B, k, m}, TensorOptions(dt).with_requires_grad());
    // a [B,m,k] x (b^T per batch)
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{bmm(in[0], in[1].transpose(1, 2))}; }, {a, bt},
        atol, rtol);
    // a weight expanded over the batch (stride 0; TPLinear): collapsible input
    testing::check_cuda_matches_cpu(
        [B](const std::vector<Tensor>& in) {
          const Tensor we = in[1].unsqueeze(0).expand({B, in[1].size(0), in[1].size(1)});
          return std::vector<Tensor>{bmm(in[0], we)};
        },
        {a, w}, atol, rtol);
    // expanded weight with a transposed (non-collapsible) input
    testing::check_cuda_matches_cpu(
        [B](const std::vector<Tensor>& in) {
          const Tensor we = in[1].unsqueeze(0).expand({B, in[1].size(0), in[1].size(1)});
          return std::vector<Tensor>{bmm(in[0].transpose(1, 2), we)};
        },
        {at, w}, atol, rtol);
  }
}

TEST_CASE("gemm: matmul and linear (transformer shapes, small)", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    const int64_t k = 64;
    const double atol = gemm_atol(dt, k), rtol = testing::rtol_for(dt);
    const Tensor x = randn({2, 5, k}, TensorOptions(dt).with_requires_grad());
    const Tensor w = randn({48, k}, TensorOptions(dt).with_requires_grad());
    const Tensor q = randn({2, 4, 5, 16}, TensorOptions(dt).with_requires_grad());
    const Tensor kk = randn({2, 4, 7, 16}, TensorOptions(dt).with_requires_grad());
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{linear(in[0], in[1])}; }, {x, w}, atol, rtol);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1].transpose(-2, -1))}; },
        {q, kk}, gemm_atol(dt, 16), rtol);
  }
}

TEST_CASE("gemm: misaligned views (offset pointers, padded rows)", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const Tensor big_a = randn({21, 40}, TensorOptions(dt).with_requires_grad());
    const Tensor big_b = randn({37, 13}, TensorOptions(dt).with_requires_grad());
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          // a: rows 1..20, cols 3..37 (pointer offset by 43 elements, row stride 40)
          // b: rows 2..36 (35 rows), all 13 cols (offset 26 elements, odd row stride)
          return std::vector<Tensor>{mm(in[0].narrow(0, 1, 20).narrow(1, 3, 35), in[1].narrow(0, 2, 35))};
        },
        {big_a, big_b}, gemm_atol(dt, 35), testing::rtol_for(dt));
  }
}

TEST_CASE("gemm: bias epilogue equals mm + bias", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const int64_t m = 40, k = 32, n = 24;
    const Tensor a = randn({m, k}, TensorOptions(dt)), w = randn({n, k}, TensorOptions(dt));
    const Tensor bias = randn({n}, TensorOptions(dt));
    const Tensor ref = add(mm(a, w.t()), bias);
    const Tensor got = cuda::gemm(a.to(dev), w.to(dev).t(), bias.to(dev));
    CHECK(testing::compare_with_cpu(got, ref, gemm_atol(dt, k), testing::rtol_for(dt), "gemm+bias") == "");
    // batched with bias
    const Tensor a3 = randn({2, m, k}, TensorOptions(dt)), b3 = randn({2, k, n}, TensorOptions(dt));
    const Tensor ref3 = add(bmm(a3, b3), bias);
    const Tensor got3 = cuda::gemm(a3.to(dev), b3.to(dev), bias.to(dev));
    CHECK(testing::compare_with_cpu(got3, ref3, gemm_atol(dt, k), testing::rtol_for(dt), "batched gemm+bias") == "");
  }
}

TEST_CASE("gemm: TF32 is opt-in for f32", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  const bool before = cuda::allow_tf32();
  const Tensor a = randn({64, 256}), b = randn({256, 64});
  const Tensor ref = mm(a, b);
  cuda::set_allow_tf32(false);
  CHECK(testing::compare_with_cpu(mm(a.to(dev), b.to(dev)), ref, gemm_atol(DType::f32, 256), 1e-5, "f32") == "");
  cuda::set_allow_tf32(true);
  // TF32 keeps 10 mantissa bits of the inputs: up to 2^-10 relative error per input, so each
  // product of N(0,1) values errs by ~8e-4 (std) and the sum of k = 256 by ~0.013; 0.1 is ~8 std.
  CHECK(testing::compare_with_cpu(mm(a.to(dev), b.to(dev)), ref, 0.1, 1e-2, "tf32") == "");
  cuda::set_allow_tf32(before);
}

TEST_CASE("gemm: addmm_ (beta 1 into self) equals the CPU's, contiguous and strided self", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  const int64_t m = 33, k = 47, n = 29;
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dtype_name(dt));
    const Tensor c0 = randn({m, n + 3}, TensorOptions(dt)), at = randn({k, m}, TensorOptions(dt)).t();
    const Tensor b = randn({k, n}, TensorOptions(dt));
    for (bool strided : {false, true}) {
      INFO("strided self " << strided);
      Tensor cpu = c0.clone(), gpu = c0.to(dev);
      Tensor cs = strided ? cpu.narrow(1, 2, n) : cpu.narrow(1, 0, n).contiguous();
      Tensor gs = strided ? gpu.narrow(1, 2, n) : gpu.narrow(1, 0, n).contiguous();
      addmm_(cs, at, b);
      addmm_(gs, at.to(dev), b.to(dev));
      const std::string msg = testing::compare_with_cpu(strided ? gpu : gs, strided ? cpu : cs, gemm_atol(dt, k),
                                                        testing::rtol_for(dt), "addmm_");
      CHECK(msg.empty());
    }
  }
}

TEST_CASE("gemm: empty dims and errors", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  const Tensor z = mm(zeros({4, 0}, TensorOptions().with_device(dev)), zeros({0, 3}, TensorOptions().with_device(dev)));
  CHECK(z.sizes() == Shape{4, 3});
  CHECK(z.to_vector<float>() == std::vector<float>(12, 0.0f));
  CHECK(mm(zeros({0, 5}, TensorOptions().with_device(dev)), zeros({5, 3}, TensorOptions().with_device(dev))).numel() ==
        0);
  CHECK_THROWS_WITH(mm(zeros({2, 2}, TensorOptions(DType::i64).with_device(dev)),
                       zeros({2, 2}, TensorOptions(DType::i64).with_device(dev))),
                    Catch::Matchers::Contains("unsupported dtype"));
}
