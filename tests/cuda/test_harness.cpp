// The CUDA test harness itself: skips without a GPU; with one, a pure copy round trip passes
// check_cuda_matches_cpu (forward and backward through to_device / clone).
#include "cuda_test_util.h"

using namespace dtr;

TEST_CASE("harness: tolerances by dtype", "[cuda]") {
  CHECK(testing::atol_for(DType::f32) == 1e-5);
  CHECK(testing::rtol_for(DType::bf16) == 1e-2);
  CHECK(testing::atol_for(DType::f16) == 1e-3);
  CHECK(testing::atol_for(DType::i64) == 0.0);
  const Tensor a = from_vector<float>({1.0f, 2.0f}, {2});
  const Tensor b = from_vector<float>({1.0f, 2.5f}, {2});
  CHECK(testing::compare_with_cpu(a, a, 0, 0, "a") == "");
  CHECK(testing::compare_with_cpu(a, b, 1e-3, 1e-3, "a").find("element 1") != std::string::npos);
}

TEST_CASE("harness: clone matches the CPU forward and backward", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Tensor x = randn({3, 5}, TensorOptions(DType::f32).with_requires_grad());
  testing::check_cuda_matches_cpu([](const std::vector<Tensor>& in) { return std::vector<Tensor>{clone(in[0])}; },
                                  {x}, testing::atol_for(DType::f32), testing::rtol_for(DType::f32));
}
