#pragma once
namespace dtr::bench {
/// `dtr-bench cpu-peak [--threads T]`: the machine's theoretical f32 FMA peak,
///   peak = cores x FMA units per core x vector lanes x 2 FLOP x clock,
/// with each factor's source printed: cores = the threads used (default omp_get_max_threads(),
/// one per core on these machines); lanes = 16 with AVX-512 (zmm) / 8 with AVX2 (ymm), from the
/// CPU flags the kernels are compiled for; clock = measured (a chain of dependent 64-bit imul,
/// 3 cycles each, best of many short runs), since a VM's model name ("Intel(R) Xeon(R)
/// Processor") hides the documented turbo; FMA units = the documented count of the
/// microarchitecture named by cpuid family / model (table in cpu_peak.cpp), or, for a model not
/// in the table, the FMA instructions per cycle measured by a loop of 16 independent FMA chains
/// rounded to an integer. The same loop run on all threads at once gives the measured FMA-loop
/// peak (the best any GEMM can do here), and STREAM's triad the memory bandwidth (the limit of
/// the memory-bound ops). Last stdout line: one JSON object (peak_gflops, peak_avx2_gflops,
/// clock_ghz, fma_units, lanes, cores, fma_loop_gflops, triad_gb_per_s, derivation, ...).
int bench_cpu_peak(int argc, char** argv);
/// Memory bandwidth in bytes/s: STREAM's triad a = b + s * c on `threads` threads over three
/// arrays of 32 Mi floats (384 MiB, allocated and freed inside), best of 10, 3 x 4 bytes per
/// element (STREAM's convention). Used by cpu-peak and by train-step's floor.
double triad_bytes_per_s(int threads);
}  // namespace dtr::bench
