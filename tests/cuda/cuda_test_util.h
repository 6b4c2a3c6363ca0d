#pragma once
// Test harness of the CUDA backend: skip without a GPU, and run a function on CPU tensors and
// on their CUDA copies, comparing outputs and input gradients (the CPU backend is the
// reference every CUDA kernel is checked against).
//
// Usage (tests/cuda/test_*.cpp, tag the test case [cuda]):
//   TEST_CASE("rms_norm matches the CPU", "[cuda]") {
//     DTR_REQUIRE_CUDA();
//     auto x = dtr::randn({4, 64}, dtr::TensorOptions(dtr::DType::bf16).with_requires_grad());
//     auto w = dtr::randn({64}, dtr::TensorOptions(dtr::DType::bf16).with_requires_grad());
//     dtr::testing::check_cuda_matches_cpu(
//         [](const std::vector<dtr::Tensor>& in) { return std::vector<dtr::Tensor>{dtr::rms_norm(in[0], in[1], 1e-6)}; },
//         {x, w}, dtr::testing::atol_for(dtr::DType::bf16), dtr::testing::rtol_for(dtr::DType::bf16));
//   }
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace dtr::testing {

/// True when the build has the CUDA backend and a CUDA device of compute capability >= 9.0 (the
/// default build targets sm_90) is current.
bool cuda_available();
/// True when env DTR_TEST_REQUIRE_CUDA=1 (set by scripts/gpu-check.sh): a CUDA test that would
/// skip for lack of a device fails instead.
bool cuda_required();
/// The device CUDA copies go to: cuda:<current device>.
Device cuda_device();

/// Default tolerances by dtype, for |cuda - cpu| <= atol + rtol * |cpu| elementwise.
///   f64:  1e-10 / 1e-10  (same formula, different summation order only)
///   f32:  1e-5  / 1e-5   (f32 sums in a different order: ~sqrt(n) ulp, n up to a few thousand)
///   bf16: 1e-2  / 1e-2   (8-bit mantissa: one rounding of the output is 2^-8 ~ 4e-3 relative;
///                         CPU and GPU may round intermediates differently, so two ulps)
///   f16:  1e-3  / 1e-3   (11-bit mantissa: one ulp is 2^-11 ~ 5e-4 relative; two ulps)
///   integers / bool: 0 (exact)
/// Reductions over many elements or chains of ops may need larger values: pass them explicitly
/// with a comment saying why.
double atol_for(DType dt);
double rtol_for(DType dt);

/// Runs `f` on `cpu_inputs` (fresh leaves with the same requires_grad) and on their CUDA copies
/// (requires_grad preserved), and REQUIREs that
///   - both runs return the same number of outputs with equal shapes and dtypes, all CUDA
///     outputs on the CUDA device, and values within atol + rtol * |cpu| elementwise;
///   - when check_backward: the gradients of sum_i sum(out_i * w_i) (w_i fixed random weights in
///     [-1, 1), so every output element matters; floating outputs that require grad only)
///     with respect to every input that requires grad agree within the same tolerance
///     (both undefined, or both defined and close).
/// Both runs start from the same random-generator state (dropout draws the same numbers).
/// Undefined tensors in `cpu_inputs` are passed through as undefined.
/// On mismatch the failure message names the output / gradient index, the element, both values.
void check_cuda_matches_cpu(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& f,
                            const std::vector<Tensor>& cpu_inputs, double atol, double rtol,
                            bool check_backward = true);

/// Compares a CUDA (or CPU) tensor with a CPU reference elementwise (|a - ref| <= atol + rtol *
/// |ref|, shapes and dtypes equal). Returns "" when close, else a message naming `what`, the
/// first bad element, both values and the max abs difference.
std::string compare_with_cpu(const Tensor& a, const Tensor& ref, double atol, double rtol, const std::string& what);

}  // namespace dtr::testing

/// Skips the rest of the current test case with a warning when no CUDA device is present
/// (Catch2 v2 has no SKIP: WARN + return; the test counts as passed). Under
/// DTR_TEST_REQUIRE_CUDA=1 (gpu-check) the missing device is a test failure instead.
#define DTR_REQUIRE_CUDA()                                                                  \
  do {                                                                                      \
    if (!::dtr::testing::cuda_available()) {                                                \
      if (::dtr::testing::cuda_required())                                                  \
        FAIL("no CUDA device, but DTR_TEST_REQUIRE_CUDA=1: this CUDA test must run on a GPU"); \
      WARN("no CUDA device (sm_90+): test skipped (runs on a GPU machine)");                          \
      return;                                                                               \
    }                                                                                       \
  } while (0)
