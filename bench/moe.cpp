// dtr-bench moe (see moe.h).
#include "bench/moe.h"

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/bench_util.h"
#include "bench/moe_profile.h"
#include "bench/train_step.h"
#include "tensor/allocator.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/nn/moe.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr::bench {
namespace {

struct MoEBenchConfig {
  int64_t tokens = 2048, hidden = 512, intermediate = 256, experts = 16, top_k = 4;
  int steps = 10, warmup = 2, threads = 0;
  bool profile = false;
  uint64_t seed = 1;
};

MoEBenchConfig parse(int argc, char** argv) {
  MoEBenchConfig c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    DTR_CHECK(i + 1 < argc, "dtr-bench moe: ", a, " needs a value");
    const char* v = argv[++i];
    auto num = [&](int64_t lo) {
      char* end = nullptr;
      const long long x = std::strtoll(v, &end, 10);
      DTR_CHECK(end && *end == '\0' && x >= lo, "dtr-bench moe: ", a, "=", v, ": expected an integer >= ", lo);
      return static_cast<int64_t>(x);
    };
    if (a == "--tokens") c.tokens = num(1);
    else if (a == "--hidden") c.hidden = num(1);
    else if (a == "--intermediate") c.intermediate = num(1);
    else if (a == "--experts") c.experts = num(1);
    else if (a == "--top-k") c.top_k = num(1);
    else if (a == "--steps") c.steps = static_cast<int>(num(1));
    else if (a == "--warmup") c.warmup = static_cast<int>(num(0));
    else if (a == "--threads") c.threads = static_cast<int>(num(1));
    else if (a == "--seed") c.seed = static_cast<uint64_t>(num(0));
    else if (a == "--profile") c.profile = num(0) != 0;
    else DTR_ERROR("dtr-bench moe: unknown argument '", a,
                   "' (expected --tokens --hidden --intermediate --experts --top-k --steps --warmup --threads --seed ",
                   "--profile)");
  }
  DTR_CHECK(c.top_k <= c.experts, "dtr-bench moe: --top-k=", c.top_k, " > --experts=", c.experts);
  return c;
}

}  // namespace

int bench_moe(int argc, char** argv) {
  const MoEBenchConfig cfg = parse(argc, argv);
  if (cfg.threads > 0) omp_set_num_threads(cfg.threads);
  manual_seed(cfg.seed);
  nn::MoEConfig mc;
  mc.hidden_size = cfg.hidden;
  mc.moe_intermediate_size = cfg.intermediate;
  mc.num_experts = cfg.experts;
  mc.num_experts_per_tok = cfg.top_k;
  mc.norm_topk_prob = true;
  auto moe = std::make_shared<nn::MoE>(mc, DType::f32);
  moe->set_parameter("gate.weight", uniform({cfg.experts, cfg.hidden}, -0.05, 0.05).set_requires_grad(true));
  Tensor x = randn({cfg.tokens, cfg.hidden}).set_requires_grad(true);
  const Tensor w = randn({cfg.tokens, cfg.hidden});

  auto step = [&] {
    Tensor loss = sum(mul(moe->call(x), w));
    loss.backward();
    for (auto& p : moe->parameters()) p.set_grad(Tensor());
    x.set_grad(Tensor());
  };
  const double cpu0 = cpu_seconds();
  const double step_s = median_seconds(step, cfg.steps, 1, cfg.warmup);
  // CPU time per step (warm-up included): with --threads 1 it measures the work, which a shared
  // machine's time slicing does not inflate as it does the wall time.
  const double cpu_step_s = (cpu_seconds() - cpu0) / (cfg.steps + cfg.warmup);
  const Shape counts = moe->last_router_stats().tokens_per_expert;
  // Peak tensor memory of one step above what is live before it (parameters, x, w), and the
  // allocations it makes (dtr's allocator counters: deterministic, unlike the times).
  const MemoryStats before = memory_stats();
  reset_peak_memory();
  step();
  const MemoryStats after = memory_stats();
  const double step_peak_mib = static_cast<double>(after.peak - before.current) / (1 << 20);
  const int64_t step_allocs = after.allocations - before.allocations;

  // The grouped experts alone on tokens already sorted by expert (the GEMM share of the step).
  const int64_t M = cfg.tokens * cfg.top_k;
  Tensor xs = randn({M, cfg.hidden}).set_requires_grad(true);
  const Tensor ws = randn({M, cfg.hidden});
  const Tensor ct = from_vector<int64_t>(counts, {cfg.experts});
  auto experts = moe->experts();
  auto experts_step = [&] {
    Tensor loss = sum(mul(experts->call_list({xs, ct}).at(0), ws));
    loss.backward();
    for (auto& p : experts->parameters()) p.set_grad(Tensor());
    xs.set_grad(Tensor());
  };
  const double experts_s = median_seconds(experts_step, cfg.steps, 1, cfg.warmup);

  const double gflop = 18e-9 * static_cast<double>(M) * static_cast<double>(cfg.hidden * cfg.intermediate);
  const double peak = sgemm_peak_flops() * 1e-9;
  const int threads = omp_get_max_threads();
  std::printf("MoE layer step (forward + backward), f32, %d threads: tokens %lld, hidden %lld, intermediate %lld, "
              "experts %lld, top-k %lld\n",
              threads, static_cast<long long>(cfg.tokens), static_cast<long long>(cfg.hidden),
              static_cast<long long>(cfg.intermediate), static_cast<long long>(cfg.experts),
              static_cast<long long>(cfg.top_k));
  std::printf("%-34s %10.2f ms  %10.0f tokens/s  %7.1f GFLOP/s of expert GEMMs (%.0f%% of SGEMM peak %.1f)\n",
              "MoE block (router + experts)", step_s * 1e3, cfg.tokens / step_s, gflop / step_s,
              100.0 * gflop / step_s / peak, peak);
  std::printf("%-34s %10.2f ms  %10s            %7.1f GFLOP/s (%.0f%% of peak)\n", "grouped experts alone",
              experts_s * 1e3, "", gflop / experts_s, 100.0 * gflop / experts_s / peak);
  // The ceiling: the step if the expert GEMMs ran at the measured SGEMM peak and nothing else
  // took time (router, permutation, SwiGLU, combine are then free).
  const double ceiling_s = gflop / peak;
  std::printf("%-34s %10.2f ms  %10.0f tokens/s  (expert GEMM FLOPs / SGEMM peak: the step is %.2fx it)\n",
              "ceiling (GEMMs at peak, rest free)", ceiling_s * 1e3, cfg.tokens / ceiling_s, step_s / ceiling_s);
  std::printf("%-34s %10.1f MiB above the inputs, %lld allocations\n", "step peak tensor memory", step_peak_mib,
              static_cast<long long>(step_allocs));
  if (cfg.profile) print_moe_profile(*moe, step, cfg.steps, step_s, peak);
  std::printf("{\"impl\": \"dtr\", \"threads\": %d, \"tokens\": %lld, \"step_ms_median\": %.4f, \"tokens_per_s\": %.2f, "
              "\"expert_gemm_gflop_per_step\": %.4f, \"expert_gemm_gflops\": %.3f, \"experts_ms_median\": %.4f, "
              "\"experts_gflops\": %.3f, \"sgemm_peak_gflops\": %.3f, \"ceiling_ms\": %.4f, \"cpu_ms_per_step\": %.4f, \"step_peak_mib\": %.2f, \"step_allocations\": %lld, "
              "\"tokens_per_expert\": [",
              threads, static_cast<long long>(cfg.tokens), step_s * 1e3, cfg.tokens / step_s, gflop, gflop / step_s,
              experts_s * 1e3, gflop / experts_s, peak, ceiling_s * 1e3, cpu_step_s * 1e3, step_peak_mib,
              static_cast<long long>(step_allocs));
  for (size_t e = 0; e < counts.size(); ++e) std::printf("%s%lld", e ? ", " : "", static_cast<long long>(counts[e]));
  std::printf("]}\n");
  return 0;
}

}  // namespace dtr::bench
