// dtr-bench: the benchmark front end (CLI11 subcommands; `dtr-bench NAME --help` prints the
// benchmark's options and runs nothing). `dtr-bench <name> [args]` with name one of cpu-peak, gemm, ops,
// dtensor, collectives, fsdp, pipeline, train-step, moe, head, cp-memory. Each prints dtr beside its
// reference, measured in the same run, except train-step, moe (bench/moe.h) and head (bench/head.h),
// which time dtr alone (bench/compare/ puts them beside PyTorch: run.sh, moe.sh, head.sh), pipeline, whose reference is the
// theory, and cp-memory (bench/cp_memory.h: peak memory per rank, one run per world size = cp).
//
// dtr-bench train-step [--layers 30] [--hidden 576] [--intermediate 1536] [--heads 9]
//     [--kv-heads 3] [--vocab 49152] [--seq 256] [--batch 4] [--lora-rank 8] [--lora-alpha 16]
//     [--steps 10] [--warmup 2] [--threads T] [--full-ft] [--fsdp] [--model CONFIG] [--save-config F]
//   Llama (SmolLM2-135M shape by default: tied embeddings, rope theta 1e5, rms eps 1e-5; --model:
//   any family from a config.json / .gguf's metadata / built-in shape, --layers cuts it), random
//   init and random token ids / labels (fixed seed, labels used unshifted), LoRA on
//   q,k,v,o,gate,up,down (or --full-ft: every weight trainable), AdamW lr 1e-4. --fsdp (under
//   mpirun): fully_shard per decoder layer + root over the world (parallelize_model). Prints the
//   per-phase and per-op tables and, as the last line, one JSON object (step_ms_median,
//   tokens_per_s, model_flops_per_step, peak_rss_mib, phases{...}). Model FLOPs formula:
//   bench/train_step.h (train_step_model_flops).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/collectives.h"
#include "bench/dtensor_overhead.h"
#include "bench/fsdp.h"
#include "bench/gemm.h"
#include "bench/cp_memory.h"
#include "bench/cpu_peak.h"
#include "bench/head.h"
#include "bench/moe.h"
#ifdef DTR_WITH_CUDA
#include "bench/gemm_gpu.h"
#endif
#include "bench/ops.h"
#include "bench/pipeline.h"
#include "bench/train_step.h"
#include "runtime/env.h"
#include "tensor/error.h"

namespace {

/// One benchmark: its subcommand, what it measures, the options its own parser takes (shown by
/// `dtr-bench NAME --help`; "" = none, and then extra arguments are errors).
struct Bench {
  const char* name;
  int (*run)(int, char**);
  const char* what;
  const char* options;
};

}  // namespace

int main(int argc, char** argv) {
  const std::vector<Bench> benches = {
      {"cpu-peak", dtr::bench::bench_cpu_peak,
       "theoretical f32 FMA peak (cores x FMA units x lanes x 2 x measured clock) and the measured FMA loop",
       "[--threads T]"},
      {"gemm", dtr::bench::bench_gemm, "dtr's SGEMM vs raw Eigen on the train-step shapes",
       "[--blas] (add OpenBLAS)  [FILTER] (shape names containing FILTER)"},
#ifdef DTR_WITH_CUDA
      {"gemm-gpu", dtr::bench::bench_gemm_gpu, "dtr's cuBLASLt path vs raw cublasGemmEx, and the 8192^3 peak",
       "[--dtype bf16|f16|f32] [--iters N]"},
#endif
      {"head", dtr::bench::bench_head,
       "LM head + loss forward + backward: fused linear_cross_entropy or linear + cross_entropy, time and peak memory",
       "[--tokens 1024] [--hidden 640] [--vocab 262144] [--impl fused|unfused] [--chunk 0] [--steps 2] [--warmup 1] "
       "[--threads T] [--seed S]"},
      {"moe", dtr::bench::bench_moe, "one MoE layer step: tokens/s, expert-GEMM GFLOP/s vs the SGEMM peak",
       "[--tokens N] [--hidden N] [--intermediate N] [--experts N] [--top-k N] [--steps N] [--warmup N] [--threads T] "
       "[--seed S]"},
      {"cp-memory", dtr::bench::bench_cp_memory,
       "peak memory per rank of a training step under context parallelism (cp = world; run under mpirun)",
       "[--seq 4096,8192,16384] [--layers 2] [--hidden 128] [--intermediate 256] [--heads 4] [--kv-heads 2] "
       "[--vocab 1024] [--threads T]"},
      {"ops", dtr::bench::bench_ops, "per-op dispatch overhead and fused-kernel GB/s vs memcpy", ""},
      {"dtensor", dtr::bench::bench_dtensor, "DTensor dispatch overhead (run under mpirun)", ""},
      {"collectives", dtr::bench::bench_collectives, "ProcessGroup vs raw MPI, nccl-tests style (under mpirun)",
       "[--max-mib N] [--min-kib N] [--ops a,b] [--rounds N]"},
      {"fsdp", dtr::bench::bench_fsdp, "FSDP bytes and peak memory vs their theoretical values (under mpirun)",
       "[--layers N] [--dim N] [--hidden N] [--vocab N] [--seq N] [--batch N] [--steps N] [--no-reshard]"},
      {"pipeline", dtr::bench::bench_pipeline,
       "pipeline bubble per schedule vs (p-1)/(m+p-1), peak memory per stage (under mpirun, pp = world)",
       "[--layers 8] [--hidden 256] [--intermediate 512] [--heads 8] [--kv-heads 4] [--vocab 1024] [--seq 128] "
       "[--rows 2] [--micro 4,8,16] [--steps 3] [--threads T]"},
      {"train-step", dtr::bench::bench_train_step, "LoRA / full training step (Llama, or --model any family): phases, per-op profile, MFU",
       "[--layers 30] [--hidden 576] [--intermediate 1536] [--heads 9] [--kv-heads 3] [--vocab 49152] [--seq 256] "
       "[--batch 4] [--lora-rank 8] [--lora-alpha 16] [--steps 10] [--warmup 2] [--threads T] [--full-ft] [--fsdp]"},
  };
  CLI::App app{"dtr-bench: dtr measured beside a reference in the same run (bench/)"};
  app.require_subcommand(1, 1);
  std::vector<std::string> args;
  for (const auto& b : benches) {
    CLI::App* sub = app.add_subcommand(b.name, b.what);
    if (*b.options) {
      sub->allow_extras();  // the benchmark's own parser reads them (and rejects unknown ones)
      sub->footer(std::string("Options of ") + b.name + ": " + b.options);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const Bench* chosen = nullptr;
  for (const auto& b : benches)
    if (app.got_subcommand(b.name)) chosen = &b;
  // The benchmark sees "NAME [its options]" as its argv.
  std::vector<std::string> rest = app.get_subcommand(chosen->name)->remaining();
  std::vector<char*> sub_argv = {const_cast<char*>(chosen->name)};
  for (auto& a : rest) sub_argv.push_back(a.data());
  sub_argv.push_back(nullptr);
  int rc = 0;
  try {
    dtr::init(argc, argv);
    rc = chosen->run(static_cast<int>(rest.size() + 1), sub_argv.data());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtr-bench: error: %s\n", e.what());
    rc = 1;
  }
  dtr::finalize();
  return rc;
}
