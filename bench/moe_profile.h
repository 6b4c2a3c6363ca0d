#pragma once
// dtr-bench moe --profile 1: where the MoE layer step goes, op by op (the dispatcher's op
// profiler over the timed steps: ms per step, share of those steps' own wall time, calls, MB moved
// and GB/s, and the time outside any op) and each of the six expert GEMMs of
// the step timed alone on the step's routing (forward gate_up and down, backward dX and dW of
// each), with its GFLOP/s and share of the SGEMM peak.
#include <functional>

#include "tensor/nn/moe.h"

namespace dtr::bench {

/// Prints both tables for `step` (one forward + backward of `moe`, already warmed up) run
/// `steps` times, with `step_s` its median time and `peak_gflops` the SGEMM peak.
void print_moe_profile(nn::MoE& moe, const std::function<void()>& step, int steps, double step_s,
                       double peak_gflops);

}  // namespace dtr::bench
