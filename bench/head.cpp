// dtr-bench head (see head.h).
#include "bench/head.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "tensor/allocator.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr::bench {
namespace {

struct HeadBenchConfig {
  int64_t tokens = 1024, hidden = 640, vocab = 262144, chunk = 0;
  std::string impl = "fused";
  int steps = 2, warmup = 1, threads = 0;
  uint64_t seed = 1;
};

HeadBenchConfig parse(int argc, char** argv) {
  HeadBenchConfig c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    DTR_CHECK(i + 1 < argc, "dtr-bench head: ", a, " needs a value");
    const char* v = argv[++i];
    auto num = [&](int64_t lo) {
      char* end = nullptr;
      const long long x = std::strtoll(v, &end, 10);
      DTR_CHECK(end && *end == '\0' && x >= lo, "dtr-bench head: ", a, "=", v, ": expected an integer >= ", lo);
      return static_cast<int64_t>(x);
    };
    if (a == "--tokens") c.tokens = num(1);
    else if (a == "--hidden") c.hidden = num(1);
    else if (a == "--vocab") c.vocab = num(1);
    else if (a == "--chunk") c.chunk = num(0);
    else if (a == "--steps") c.steps = static_cast<int>(num(1));
    else if (a == "--warmup") c.warmup = static_cast<int>(num(0));
    else if (a == "--threads") c.threads = static_cast<int>(num(1));
    else if (a == "--seed") c.seed = static_cast<uint64_t>(num(0));
    else if (a == "--impl") {
      c.impl = v;
      DTR_CHECK(c.impl == "fused" || c.impl == "unfused", "dtr-bench head: --impl=", c.impl,
                ": expected fused or unfused");
    } else
      DTR_ERROR("dtr-bench head: unknown argument '", a,
                "' (expected --tokens --hidden --vocab --impl --chunk --steps --warmup --threads --seed)");
  }
  return c;
}

/// Resident set now, MiB (/proc/self/statm, second field, pages).
double rss_mib() {
  std::ifstream f("/proc/self/statm");
  long long size = 0, resident = 0;
  f >> size >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

/// Peak resident set of the process so far, MiB (getrusage ru_maxrss, KiB on Linux).
double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

}  // namespace

int bench_head(int argc, char** argv) {
  const HeadBenchConfig cfg = parse(argc, argv);
  if (cfg.threads > 0) omp_set_num_threads(cfg.threads);
  manual_seed(cfg.seed);
  const int64_t N = cfg.tokens, H = cfg.hidden, V = cfg.vocab;
  Tensor x = randn({N, H}).set_requires_grad(true);
  Tensor w = randn({V, H});
  mul_(w, 0.02);  // in place: no freed temporary left in the allocator's cache before the baseline
  w.set_requires_grad(true);
  std::vector<int64_t> tv(static_cast<size_t>(N));
  {
    const std::vector<float> u = uniform({N}, 0.0, static_cast<double>(V)).to_vector<float>();
    for (int64_t i = 0; i < N; ++i) tv[i] = i % 8 == 7 ? -100 : std::min<int64_t>(V - 1, static_cast<int64_t>(u[i]));
  }
  const Tensor t = from_vector<int64_t>(tv, {N});
  const bool fused = cfg.impl == "fused";
  const double rss0 = rss_mib();
  const int64_t alloc0 = memory_stats().current;
  reset_peak_memory();
  double loss = 0;
  auto step = [&] {
    Tensor l = fused ? linear_cross_entropy(x, w, t, -100, cfg.chunk) : cross_entropy(linear(x, w), t);
    l.backward();
    loss = l.item<double>();
    x.set_grad(Tensor());
    w.set_grad(Tensor());
  };
  for (int i = 0; i < cfg.warmup; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < cfg.steps; ++i) {
    const double t0 = now_s();
    step();
    times.push_back(now_s() - t0);
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  const double step_s = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  const double alloc_mib = static_cast<double>(memory_stats().peak - alloc0) / (1024.0 * 1024.0);
  const double rss_mib_delta = max_rss_mib() - rss0;
  const double gflop = 6e-9 * static_cast<double>(N) * static_cast<double>(H) * static_cast<double>(V);
  const int threads = omp_get_max_threads();
  std::printf("head %s, f32, %d threads: tokens %lld, hidden %lld, vocab %lld: %.1f ms/step (%.1f GFLOP/s), "
              "peak alloc +%.0f MiB, peak RSS +%.0f MiB, loss %.6f\n",
              cfg.impl.c_str(), threads, static_cast<long long>(N), static_cast<long long>(H),
              static_cast<long long>(V), step_s * 1e3, gflop / step_s, alloc_mib, rss_mib_delta, loss);
  std::printf("{\"impl\": \"dtr-%s\", \"threads\": %d, \"tokens\": %lld, \"hidden\": %lld, \"vocab\": %lld, "
              "\"step_ms_median\": %.3f, \"loss\": %.8f, \"peak_alloc_mib\": %.1f, \"peak_rss_delta_mib\": %.1f, "
              "\"head_gflop_per_step\": %.3f}\n",
              cfg.impl.c_str(), threads, static_cast<long long>(N), static_cast<long long>(H),
              static_cast<long long>(V), step_s * 1e3, loss, alloc_mib, rss_mib_delta, gflop);
  return 0;
}

}  // namespace dtr::bench
