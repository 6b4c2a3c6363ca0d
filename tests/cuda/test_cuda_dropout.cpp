// CUDA dropout (tensor/ops/cuda/dropout.cu) draws the CPU's Philox numbers: the CUDA output
// equals the CPU output exactly (same mask bit for bit, same scaling), for f32 and bf16, any
// size and strides, in backward, and for a shard of a distributed tensor (global indexing).
#include "cuda_test_util.h"
#include "tensor/ops/cuda/philox.cuh"
#include "tensor/dispatch.h"
#include "tensor/random.h"

using namespace dtr;

TEST_CASE("the kernels' Philox (philox.cuh, host build) equals dtr::philox_uniform", "[cuda]") {
  // Runs without a GPU: the same source compiles for the device, where only the high-word
  // multiply differs (__umulhi instead of the 64-bit product).
  int64_t mismatches = 0;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1234}, uint64_t{0xdeadbeefcafef00dull}})
    for (uint64_t base : {uint64_t{0}, uint64_t{4097}, uint64_t{1} << 40})
      for (uint64_t i = 0; i < 257; ++i)
        mismatches += cuda_ops::philox_uniform_hd(seed, base + i) != philox_uniform(seed, base + i);
  CHECK(mismatches == 0);
}

TEST_CASE("cuda dropout equals the CPU dropout exactly", "[cuda]") {
  DTR_REQUIRE_CUDA();
  manual_seed(1234);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Shape& shape : {Shape{1}, Shape{7}, Shape{1031}, Shape{7, 33}}) {
      INFO("dtype " << dt << " shape " << detail::cat(shape));
      const Tensor x = uniform(shape, -2.0, 2.0).to(dt).set_requires_grad(true);
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{dropout(in[0], 0.3, true)}; }, {x}, 0.0,
          0.0);
    }
    INFO("dtype " << dt << " non-contiguous input");
    const Tensor x = uniform({33, 7}, -2.0, 2.0).to(dt).set_requires_grad(true);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{dropout(in[0].transpose(0, 1), 0.5, true)}; },
        {x}, 0.0, 0.0);
  }
}

TEST_CASE("cuda dropout mask is philox_uniform(seed, offset + i) >= p", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const double p = 0.25;
  const int64_t seed = 77, offset = 4096 + 3;  // an offset that is not a multiple of 4
  const int64_t n = 1031;
  const Tensor ones_g = ones({n}).to(testing::cuda_device());
  const Tensor out = dispatch1(OpCall{op_def("dropout"), {ones_g}, {p, seed, offset}});
  const std::vector<float> v = out.to_vector<float>();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = static_cast<double>(philox_uniform(seed, offset + i)) >= p;
    const float expect = keep ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
    mismatches += v[i] != expect;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("cuda dropout of a shard uses global indices like the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const double p = 0.4;
  const int64_t seed = 5, offset = 10;
  // Global [8, 10]; this shard is rows 4..7, columns 5..9.
  const Tensor local = uniform({4, 5}, -1.0, 1.0);
  const std::vector<Attr> attrs = {p, seed, offset, Shape{8, 10}, Shape{4, 5}};
  const Tensor cpu = dispatch1(OpCall{op_def("dropout"), {local}, attrs});
  const Tensor gpu = dispatch1(OpCall{op_def("dropout"), {local.to(testing::cuda_device())}, attrs});
  CHECK(testing::compare_with_cpu(gpu, cpu, 0.0, 0.0, "sharded dropout") == "");
  // And it is the slice of the global mask.
  const Tensor global = zeros({8, 10});
  narrow(narrow(global, 0, 4, 4), 1, 5, 5).copy_(local);
  const Tensor full = dispatch1(OpCall{op_def("dropout"), {global.to(testing::cuda_device())}, {p, seed, offset}});
  CHECK(testing::compare_with_cpu(narrow(narrow(full, 0, 4, 4), 1, 5, 5).contiguous(), cpu, 0.0, 0.0,
                                  "slice of the global dropout") == "");
}
