// dtr-bench cpu-peak (see cpu_peak.h).
#include "bench/cpu_peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_util.h"

namespace dtr::bench {
namespace {

/// What /proc/cpuinfo says about processor 0.
struct CpuInfo {
  std::string vendor, model_name, flags;
  int family = -1, model = -1;
  bool has(const std::string& f) const { return (" " + flags + " ").find(" " + f + " ") != std::string::npos; }
};

CpuInfo read_cpuinfo() {
  CpuInfo c;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  auto value = [](const std::string& l) {
    const auto p = l.find(':');
    std::string v = p == std::string::npos ? "" : l.substr(p + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  };
  while (std::getline(in, line)) {
    if (line.empty()) break;  // processor 0 only
    if (line.rfind("vendor_id", 0) == 0) c.vendor = value(line);
    else if (line.rfind("model name", 0) == 0) c.model_name = value(line);
    else if (line.rfind("cpu family", 0) == 0) c.family = std::atoi(value(line).c_str());
    else if (line.rfind("model", 0) == 0 && line.find(':') != std::string::npos && line.rfind("model name", 0) != 0)
      c.model = std::atoi(value(line).c_str());
    else if (line.rfind("flags", 0) == 0) c.flags = value(line);
  }
  return c;
}

/// Documented FMA units per core of a few server microarchitectures (Intel's optimisation
/// manual: two 512-bit FMA ports, p0+p1 fused and p5, on Xeon Scalable; on Skylake-SP / Cascade
/// Lake only some SKUs have the p5 unit: ARK's "# of AVX-512 FMA Units", sku_zmm_units below;
/// AMD's software optimisation guides: Zen 2-4 two 256-bit FMA pipes, AVX-512 on Zen 4 issued as
/// two 256-bit halves, i.e. one zmm FMA per cycle).
struct Uarch {
  const char* vendor;
  int family, model;  // model -1: any
  const char* name;
  int zmm_units, ymm_units;  // FMA instructions per cycle of each width; zmm -1: by SKU
};
constexpr Uarch kUarchs[] = {
    {"GenuineIntel", 6, 85, "Skylake-SP / Cascade Lake (Xeon Scalable 1st/2nd gen)", -1, 2},
    {"GenuineIntel", 6, 106, "Ice Lake-SP (Xeon Scalable 3rd gen)", 2, 2},
    {"GenuineIntel", 6, 143, "Sapphire Rapids (Xeon Scalable 4th gen)", 2, 2},
    {"GenuineIntel", 6, 207, "Emerald Rapids (Xeon Scalable 5th gen)", 2, 2},
    {"GenuineIntel", 6, 173, "Granite Rapids (Xeon 6 P-core)", 2, 2},
    {"AuthenticAMD", 23, -1, "Zen / Zen 2 (EPYC 7001/7002)", 0, 2},
    {"AuthenticAMD", 25, 17, "Zen 4 (EPYC 9004)", 1, 2},
    {"AuthenticAMD", 25, -1, "Zen 3 / Zen 4 (EPYC 7003/9004)", 1, 2},
};

/// AVX-512 FMA units of a Skylake-SP / Cascade Lake Xeon Scalable from its model name ("Intel(R)
/// Xeon(R) Gold 5118 CPU @ 2.30GHz"): Platinum 8xxx / 9xxx and Gold 6xxx have two, Gold 5xxx one
/// except the Gold 5122 and 5222, Silver 4xxx and Bronze 3xxx one (Intel ARK per SKU). 0: the name
/// names no such SKU. `sku` receives the tier and number found ("Gold 5118").
int sku_zmm_units(const std::string& model_name, std::string& sku) {
  for (const char* tier : {"Platinum", "Gold", "Silver", "Bronze"}) {
    const size_t at = model_name.find(std::string(tier) + " ");
    if (at == std::string::npos) continue;
    const size_t num = at + std::strlen(tier) + 1;
    size_t end = num;
    while (end < model_name.size() && std::isdigit(static_cast<unsigned char>(model_name[end]))) ++end;
    if (end - num != 4) return 0;
    const std::string n = model_name.substr(num, 4);
    sku = std::string(tier) + " " + n;
    if (sku == "Gold 5122" || sku == "Gold 5222") return 2;
    if (std::string(tier) == "Platinum" || (std::string(tier) == "Gold" && n[0] == '6')) return 2;
    return 1;
  }
  return 0;
}

}  // namespace

std::optional<FmaUnits> documented_fma_units(const std::string& vendor, int family, int model,
                                             const std::string& model_name) {
  for (const Uarch& u : kUarchs) {
    if (vendor != u.vendor || family != u.family || (u.model >= 0 && u.model != model)) continue;
    FmaUnits f{u.name, u.zmm_units, u.ymm_units, std::string("documented for ") + u.name};
    if (u.zmm_units < 0) {
      std::string sku;
      f.zmm = sku_zmm_units(model_name, sku);
      f.basis = f.zmm > 0 ? "documented for the Xeon " + sku + " (" + u.name + ")"
                          : std::string(u.name) + ": 1 or 2 by SKU, and the model name '" + model_name +
                                "' names none";
    }
    return f;
  }
  return std::nullopt;
}

namespace {

/// Best seconds of `fn` over `reps` runs (the fastest run is the one least disturbed by other
/// processes on a shared machine).
template <class F>
double best_of(int reps, F fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

volatile float g_sink = 0;  // keeps the measured loops' results alive

/// Cycles per second of this core: `iters` x 32 dependent 64-bit `imul` (latency 3 cycles on
/// every Intel core since Nehalem and every AMD Zen; a chain of `add $1` is not used: Golden
/// Cove and later fold immediate adds at rename, several per cycle).
double measure_clock_hz() {
  // Many short runs (0.5 M cycles, ~0.2 ms): on a loaded machine the shortest is the one that ran
  // without being descheduled.
  const int64_t iters = 5000;
  auto run = [&] {
    uint64_t x = 3;
    for (int64_t i = 0; i < iters; ++i)
      asm volatile(".rept 32\n\timul %0, %0\n\t.endr" : "+r"(x));
    g_sink = g_sink + static_cast<float>(x & 1);
  };
  run();
  return static_cast<double>(iters) * 32.0 * 3.0 / best_of(400, run);
}

// 12 independent FMA chains (registers 0-11, multiplicands 12 and 13, all zero: no denormal
// assists) of one vector width, `iters` rounds, in asm so that the chains stay in registers:
// returns the FMA instructions executed. 12 chains cover 2 units x 4 cycles of latency + slack.
#define DTR_FMA_LOOP(NAME, REG)                                                                   \
  double NAME(int64_t iters) {                                                                    \
    int64_t n = iters;                                                                            \
    asm volatile(".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13\n\tvxorps %%" REG "\\r, %%" REG "\\r, %%" REG \
                 "\\r\n\t.endr\n"                                                                   \
                 "1:\n\t.irp r,0,1,2,3,4,5,6,7,8,9,10,11\n\tvfmadd231ps %%" REG "12, %%" REG "13, %%" REG  \
                 "\\r\n\t.endr\n\tdec %0\n\tjnz 1b"                                                 \
                 : "+r"(n)                                                                        \
                 :                                                                                \
                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                   "xmm10", "xmm11", "xmm12", "xmm13", "cc");                                      \
    return 12.0 * static_cast<double>(iters);                                                     \
  }
#ifdef __FMA__
DTR_FMA_LOOP(fma_loop_ymm, "ymm")
#endif
#ifdef __AVX512F__
DTR_FMA_LOOP(fma_loop_zmm, "zmm")
#endif
#undef DTR_FMA_LOOP

/// FMA instructions per second summed over `threads` threads running `loop` at once (best of
/// 100 short runs each).
double fma_rate(double (*loop)(int64_t), int threads) {
  const int64_t iters = 40000;  // 0.5 M FMAs per thread per run: ~0.1 ms
  std::vector<double> rate(static_cast<size_t>(threads), 0.0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    double best = 1e30, n = 0;
    for (int r = 0; r < 100; ++r) {
      const double t0 = now_s();
      n = loop(iters);
      best = std::min(best, now_s() - t0);
    }
    rate[static_cast<size_t>(t)] = n / best;
  }
  double s = 0;
  for (double r : rate) s += r;
  return s;
}

}  // namespace

/// Memory bandwidth in bytes/s: STREAM's triad a = b + s * c on `threads` threads over three
/// arrays of 32 Mi floats (384 MiB, past the caches), best of 10, counting 3 x 4 bytes per element
/// (STREAM's convention: the write-allocate read of a is not counted). The limit of the
/// memory-bound ops (elementwise, norms, softmax) beside the FMA peak of the GEMMs.
double triad_bytes_per_s(int threads) {
  const size_t n = size_t(32) << 20;
  float* a = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  float* b = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  float* c = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  if (!a || !b || !c) {
    std::free(a), std::free(b), std::free(c);
    return 0;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;  // first touch by the thread that uses it
  const double t = best_of(10, [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
  });
  g_sink = g_sink + a[n / 2];
  std::free(a), std::free(b), std::free(c);
  return 3.0 * sizeof(float) * static_cast<double>(n) / t;
}

int bench_cpu_peak(int argc, char** argv) {
  int threads = omp_get_max_threads();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) threads = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "dtr-bench cpu-peak: bad argument '%s' (expected [--threads T], T >= 1)\n", a.c_str());
      return 2;
    }
  }
#ifndef __FMA__
  std::fprintf(stderr, "dtr-bench cpu-peak: this build has no FMA kernels (DTR_KERNEL_ARCH without FMA)\n");
  return 2;
#else
  const CpuInfo cpu = read_cpuinfo();
  const std::optional<FmaUnits> ua = documented_fma_units(cpu.vendor, cpu.family, cpu.model, cpu.model_name);
  const double hz = measure_clock_hz();
  // Measured FMA instructions per cycle per core (one thread) and the all-thread loop rate.
  const double ymm1 = fma_rate(fma_loop_ymm, 1) / hz;
  const double ymm_all = fma_rate(fma_loop_ymm, threads);
  double zmm1 = 0, zmm_all = 0;
#ifdef __AVX512F__
  zmm1 = fma_rate(fma_loop_zmm, 1) / hz;
  zmm_all = fma_rate(fma_loop_zmm, threads);
#endif
  const bool avx512 = zmm1 > 0;
  const int lanes = avx512 ? 16 : 8;
  const double units_measured = avx512 ? zmm1 : ymm1;
  const int units_doc = ua ? (avx512 ? ua->zmm : ua->ymm) : 0;
  // Not documented: the measured rate rounded (a Skylake-SP / Cascade Lake SKU not named: 1 or 2).
  int units = units_doc > 0 ? units_doc : std::max(1, static_cast<int>(std::lround(units_measured)));
  if (units_doc == 0 && ua && ua->zmm == 0 && avx512) units = std::min(units, 2);
  const int ymm_units = ua && ua->ymm > 0 ? ua->ymm : std::max(1, static_cast<int>(std::lround(ymm1)));
  const std::string cpuid = "cpuid family " + std::to_string(cpu.family) + " model " + std::to_string(cpu.model);
  const std::string units_why =
      units_doc > 0 ? (avx512 ? ua->basis : std::string("documented for ") + ua->uarch) + ", " + cpuid
      : ua          ? "inferred from the measured rate, rounded: " + ua->basis + ", " + cpuid
                    : "inferred from the measured rate, rounded: " + cpuid + " is not in the table";
  const double peak = threads * units * lanes * 2.0 * hz;
  const double peak_avx2 = threads * ymm_units * 8 * 2.0 * hz;
  const double loop = (avx512 ? zmm_all : ymm_all) * lanes * 2.0;
  const double bw = triad_bytes_per_s(threads);

  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "%d cores x %d FMA units (%s; measured %.2f %s FMA/cycle on one core) x %d f32 lanes (%s) x 2 FLOP x "
                "%.2f GHz (measured: a chain of dependent imul, 3 cycles each; the model name '%s' %s) = %.1f GFLOP/s",
                threads, units, units_why.c_str(), units_measured, avx512 ? "zmm" : "ymm", lanes, avx512 ? "AVX-512 zmm" : "AVX2 ymm", hz * 1e-9,
                cpu.model_name.c_str(),
                cpu.model_name.find("GHz") == std::string::npos ? "gives no clock" : "states a base clock only",
                peak * 1e-9);
  std::printf("dtr-bench cpu-peak: %s (%s), %d threads\n", cpu.model_name.c_str(), cpu.vendor.c_str(), threads);
  std::printf("  theoretical f32 peak: %s\n", buf);
  std::printf("  AVX2 (ymm) peak: %d x %d x 8 x 2 x %.2f GHz = %.1f GFLOP/s (measured %.2f ymm FMA/cycle)\n", threads,
              ymm_units, hz * 1e-9, peak_avx2 * 1e-9, ymm1);
  std::printf("  measured FMA loop on %d threads at once: %.1f GFLOP/s (%.1f%% of the theoretical peak; ymm %.1f)\n",
              threads, loop * 1e-9, 100.0 * loop / peak, ymm_all * 16.0 * 1e-9);
  std::printf("  memory bandwidth (STREAM triad, %d threads, 384 MiB): %.1f GB/s\n", threads, bw * 1e-9);
  nlohmann::json j = {{"bench", "cpu-peak"},
                      {"model_name", cpu.model_name},
                      {"vendor", cpu.vendor},
                      {"family", cpu.family},
                      {"model", cpu.model},
                      {"uarch", ua ? ua->uarch : ""},
                      {"cores", threads},
                      {"fma_units", units},
                      {"fma_units_source", units_doc > 0 ? "documented" : "inferred"},
                      {"fma_per_cycle_measured", units_measured},
                      {"lanes", lanes},
                      {"clock_ghz", hz * 1e-9},
                      {"peak_gflops", peak * 1e-9},
                      {"peak_avx2_gflops", peak_avx2 * 1e-9},
                      {"fma_loop_gflops", loop * 1e-9},
                      {"fma_loop_avx2_gflops", ymm_all * 16.0 * 1e-9},
                      {"triad_gb_per_s", bw * 1e-9},
                      {"derivation", buf}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
#endif
}

}  // namespace dtr::bench
