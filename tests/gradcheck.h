#pragma once
// Finite-difference gradient check (central differences in f64), the reference every op's
// backward is tested against. Source: the method of torch.autograd.gradcheck.
#include <functional>
#include <string>
#include <vector>

#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr::testing {

/// Tolerances for f64 central differences with eps = 1e-6: truncation error O(eps^2) and
/// rounding error O(1e-16 / eps) both far below 1e-6 relative for smooth ops.
constexpr double kGradEps = 1e-6;
constexpr double kGradAtol = 1e-6;
constexpr double kGradRtol = 1e-5;

/// Compares the analytic gradient of sum(f(inputs) * w) (w a fixed random weight, so every
/// output element matters) with central finite differences for every input that requires
/// grad. Inputs must be f64 leaves. Returns an empty string on success, else a message
/// naming the input, element and both values.
std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs);

/// The f64 weight w[i] = cos(0.37 i + 0.1) over the flat index: the golden fixtures' gradients are
/// of sum(out * w) with it (tests/golden/make_*_fixture.py).
Tensor golden_grad_weight(const Shape& shape);

/// max |a - b| over all elements (shapes must match).
double max_abs_diff(const Tensor& a, const Tensor& b);
/// True when |a - b| <= atol + rtol * |b| elementwise.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

/// Runs `run` on 1 OpenMP thread and on each count of `threads` (restoring the setting after):
/// an empty string when every output is bit-equal to the 1-thread run's, else a message naming
/// the thread count and the output.
std::string same_bits_on_threads(const std::function<std::vector<Tensor>()>& run,
                                 const std::vector<int>& threads = {2, 3});

}  // namespace dtr::testing
