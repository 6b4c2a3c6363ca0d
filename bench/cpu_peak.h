#pragma once
#include <optional>
#include <string>

namespace dtr::bench {
/// `dtr-bench cpu-peak [--threads T]`: the machine's theoretical f32 FMA peak,
///   peak = cores x FMA units per core x vector lanes x 2 FLOP x clock,
/// with each factor's source printed: cores = the threads used (default omp_get_max_threads(),
/// one per core on these machines); lanes = 16 with AVX-512 (zmm) / 8 with AVX2 (ymm), from the
/// CPU flags the kernels are compiled for; clock = measured (a chain of dependent 64-bit imul,
/// 3 cycles each, best of many short runs), since a VM's model name ("Intel(R) Xeon(R)
/// Processor") hides the documented turbo; FMA units = the documented count of the
/// microarchitecture named by cpuid family / model (documented_fma_units; on Skylake-SP /
/// Cascade Lake the SKU in the model name), or, where that does not decide (a model not in the
/// table, a Skylake-SP / Cascade Lake VM whose model name names no SKU), inferred: the FMA
/// instructions per cycle measured by a loop of 12 independent FMA chains rounded to an integer,
/// and the derivation says so (fma_units_source "documented" / "inferred"). The same loop run on all threads at once gives the measured FMA-loop
/// peak (the best any GEMM can do here), and STREAM's triad the memory bandwidth (the limit of
/// the memory-bound ops). Last stdout line: one JSON object (peak_gflops, peak_avx2_gflops,
/// clock_ghz, fma_units, lanes, cores, fma_loop_gflops, triad_gb_per_s, derivation, ...).
int bench_cpu_peak(int argc, char** argv);

/// FMA units per core of a CPU, as documented (cpu_peak.cpp's table).
struct FmaUnits {
  std::string uarch;  // e.g. "Skylake-SP / Cascade Lake (Xeon Scalable 1st/2nd gen)"
  int zmm = 0, ymm = 0;  // FMA instructions per cycle of each width; 0: none, or not decided (see basis)
  std::string basis;     // why zmm is what it is, for the printed derivation
};
/// Looks the CPU up by vendor and cpuid family / model. Skylake-SP / Cascade Lake (family 6 model
/// 85) is the one server family whose SKUs differ, so its AVX-512 units come from the model name
/// (Intel ARK's "# of AVX-512 FMA Units" per SKU): Platinum, Gold 6xxx, Gold 5122 and 5222: 2;
/// other Gold 5xxx, Silver, Bronze: 1; a model name that names no SKU (a VM's "Intel(R) Xeon(R)
/// Processor") leaves zmm = 0, to be inferred by the caller. nullopt: not in the table.
std::optional<FmaUnits> documented_fma_units(const std::string& vendor, int family, int model,
                                             const std::string& model_name);
/// Memory bandwidth in bytes/s: STREAM's triad a = b + s * c on `threads` threads over three
/// arrays of 32 Mi floats (384 MiB, allocated and freed inside), best of 10, 3 x 4 bytes per
/// element (STREAM's convention). Used by cpu-peak and by train-step's floor.
double triad_bytes_per_s(int threads);
}  // namespace dtr::bench
