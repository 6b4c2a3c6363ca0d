// dtr-bench moe --profile (see moe_profile.h).
#include "bench/moe_profile.h"

#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/profiler.h"

namespace dtr::bench {

void print_moe_profile(nn::MoE& moe, const std::function<void()>& step, int steps, double step_s,
                       double peak_gflops) {
  reset_op_profile();
  double wall_s = 0;
  {
    OpProfilerScope prof;
    const double t0 = now_s();
    for (int i = 0; i < steps; ++i) step();
    wall_s = (now_s() - t0) / steps;
  }
  // Shares of the profiled steps' own mean wall time (same window as the op times, so "outside
  // any op" is what the step spends between dispatches, not the drift between two windows).
  const std::vector<OpProfileEntry> ops = op_profile();
  std::printf("\nops of the step (wall time around each dispatch, per step; profiled steps %.2f ms each, median "
              "step %.2f ms)\n",
              wall_s * 1e3, step_s * 1e3);
  std::printf("  %-28s %9s %8s %7s %8s %7s\n", "op", "ms", "% step", "calls", "MB", "GB/s");
  double total = 0;
  for (const OpProfileEntry& e : ops) {
    const double ms = e.seconds / steps * 1e3;
    total += ms;
    std::printf("  %-28s %9.2f %7.1f%% %7.1f %8.1f %7.1f\n", e.name.c_str(), ms, 100.0 * ms / (wall_s * 1e3),
                static_cast<double>(e.calls) / steps, e.bytes / steps * 1e-6, e.seconds > 0 ? e.bytes / e.seconds * 1e-9 : 0.0);
  }
  std::printf("  %-28s %9.2f %7.1f%%\n", "all ops", total, 100.0 * total / (wall_s * 1e3));
  std::printf("  %-28s %9.2f %7.1f%%   (autograd engine, allocation, host routing, module calls)\n",
              "outside any op", wall_s * 1e3 - total, 100.0 - 100.0 * total / (wall_s * 1e3));

  // The six expert GEMMs of the step, alone, on the step's routing and the block's weights.
  NoGradGuard ng;
  auto experts = moe.experts();
  const Shape counts = moe.last_router_stats().tokens_per_expert;
  int64_t M = 0;
  for (int64_t c : counts) M += c;
  const Tensor w1 = experts->parameter("gate_up_proj").detach(), w2 = experts->parameter("down_proj").detach();
  const int64_t H = w1.size(2), I2 = w1.size(1), I = w2.size(2);
  const Tensor x = randn({M, H}), h = randn({M, I}), g1 = randn({M, I2}), gy = randn({M, H});
  struct Gemm {
    const char* name;
    double flop;
    std::function<Tensor()> run;
  };
  const double m = static_cast<double>(M);
  const std::vector<Gemm> gemms = {
      {"fwd gate_up x W1^T [M,2I]", 2 * m * H * I2, [&] { return grouped_mm(x, w1.transpose(1, 2), counts); }},
      {"fwd down h W2^T [M,H]", 2 * m * I * H, [&] { return grouped_mm(h, w2.transpose(1, 2), counts); }},
      {"bwd down dh = gy W2 [M,I]", 2 * m * H * I, [&] { return grouped_mm(gy, w2, counts); }},
      {"bwd down dW2 = gy^T h [E,H,I]", 2 * m * H * I, [&] { return grouped_mm(gy.t(), h, counts); }},
      {"bwd gate_up dx = g W1 [M,H]", 2 * m * I2 * H, [&] { return grouped_mm(g1, w1, counts); }},
      {"bwd gate_up dW1 = g^T x [E,2I,H]", 2 * m * I2 * H, [&] { return grouped_mm(g1.t(), x, counts); }},
  };
  std::printf("\nexpert GEMMs alone (M = %lld token copies, median of %d)\n", static_cast<long long>(M), steps);
  std::printf("  %-34s %9s %9s %8s\n", "GEMM", "ms", "GFLOP/s", "% peak");
  double sum_ms = 0;
  for (const Gemm& g : gemms) {
    const double s = median_seconds([&] { (void)g.run(); }, steps, 1, 1);
    sum_ms += s * 1e3;
    std::printf("  %-34s %9.2f %9.1f %7.0f%%\n", g.name, s * 1e3, g.flop / s * 1e-9,
                100.0 * g.flop / s * 1e-9 / peak_gflops);
  }
  std::printf("  %-34s %9.2f ms (%.0f%% of the step)\n", "sum", sum_ms, 100.0 * sum_ms / (step_s * 1e3));
}

}  // namespace dtr::bench
