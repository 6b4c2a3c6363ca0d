// dtr-bench: the benchmark front end. `dtr-bench <name> [args]` with name one of gemm, ops,
// dtensor, collectives, fsdp, train-step, moe. Each prints dtr beside its reference, measured in
// the same run, except train-step and moe (bench/moe.h), which time dtr alone (bench/compare/
// puts them beside PyTorch: run.sh, moe.sh).
//
// dtr-bench train-step [--layers 30] [--hidden 576] [--intermediate 1536] [--heads 9]
//     [--kv-heads 3] [--vocab 49152] [--seq 256] [--batch 4] [--lora-rank 8] [--lora-alpha 16]
//     [--steps 10] [--warmup 2] [--threads T] [--full-ft] [--fsdp]
//   Llama (SmolLM2-135M shape by default: tied embeddings, rope theta 1e5, rms eps 1e-5), random
//   init and random token ids / labels (fixed seed, labels used unshifted), LoRA on
//   q,k,v,o,gate,up,down (or --full-ft: every weight trainable), AdamW lr 1e-4. --fsdp (under
//   mpirun): fully_shard per decoder layer + root over the world (parallelize_model). Prints the
//   per-phase and per-op tables and, as the last line, one JSON object (step_ms_median,
//   tokens_per_s, model_flops_per_step, peak_rss_mib, phases{...}). Model FLOPs formula:
//   bench/train_step.h (train_step_model_flops).
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "bench/collectives.h"
#include "bench/dtensor_overhead.h"
#include "bench/fsdp.h"
#include "bench/gemm.h"
#include "bench/moe.h"
#ifdef DTR_WITH_CUDA
#include "bench/gemm_gpu.h"
#endif
#include "bench/ops.h"
#include "bench/train_step.h"
#include "runtime/env.h"
#include "tensor/error.h"

int main(int argc, char** argv) {
  const std::map<std::string, int (*)(int, char**)> benches = {
      {"gemm", dtr::bench::bench_gemm},
#ifdef DTR_WITH_CUDA
      {"gemm-gpu", dtr::bench::bench_gemm_gpu},
#endif
      {"moe", dtr::bench::bench_moe},
      {"ops", dtr::bench::bench_ops},
      {"dtensor", dtr::bench::bench_dtensor},
      {"collectives", dtr::bench::bench_collectives},
      {"fsdp", dtr::bench::bench_fsdp},
      {"train-step", dtr::bench::bench_train_step},
  };
  if (argc < 2 || !benches.count(argv[1])) {
    std::fprintf(stderr, "usage: dtr-bench <name> [args]   names:");
    for (auto& [n, f] : benches) std::fprintf(stderr, " %s", n.c_str());
    std::fprintf(stderr, "\n  (options of each: see apps/dtr_bench.cpp and bench/*.h)\n");
    return 2;
  }
  int rc = 0;
  try {
    dtr::init(argc, argv);
    rc = benches.at(argv[1])(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtr-bench: error: %s\n", e.what());
    rc = 1;
  }
  dtr::finalize();
  return rc;
}
