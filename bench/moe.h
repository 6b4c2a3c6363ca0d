#pragma once
// dtr-bench moe: one MoE layer step (forward + backward of nn::MoE, f32) on random tokens, with
// the FLOPs of the expert GEMMs, so that bench/compare/moe.sh can put it beside transformers'
// Qwen3MoeSparseMoeBlock on the same shape and thread count.
//
// dtr-bench moe [--tokens 2048] [--hidden 512] [--intermediate 256] [--experts 16] [--top-k 4]
//     [--steps 10] [--warmup 2] [--threads T] [--seed 1] [--profile 0|1]
//   Router U(-0.05, 0.05) (non-degenerate routing), experts nn.Linear-style init, input N(0, 1),
//   loss sum(out * w) with a fixed random w. Prints a table and, as the last line, one JSON object:
//   step_ms_median, tokens_per_s, expert_gemm_gflop_per_step, expert_gemm_gflops (expert GEMM
//   FLOPs / median step time), experts_ms_median (the grouped experts alone, forward + backward,
//   on sorted tokens), experts_gflops, sgemm_peak_gflops (dtr f32 matmul 1024^3, best of 5),
//   ceiling_ms (expert GEMM FLOPs / the SGEMM peak: the step if the GEMMs ran at the peak and
//   nothing else took time), cpu_ms_per_step (process CPU time per step, warm-up included: the
//   work, with --threads 1, on a shared machine), step_peak_mib and step_allocations (one more step:
//   dtr's allocator peak above what was live before it, and its allocate() calls; deterministic),
//   tokens_per_expert (the routing of the timed input). --profile 1
//   adds the op-by-op table and the six expert GEMMs timed alone (bench/moe_profile.h).
//   Expert GEMM FLOPs per step: 3 GEMMs (gate, up, down) of 2 * T * k * H * I each forward,
//   twice that backward: 18 * T * k * H * I.
namespace dtr::bench {
int bench_moe(int argc, char** argv);
}  // namespace dtr::bench
