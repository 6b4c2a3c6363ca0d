#pragma once
#include <string>
// dtr-bench train-step: one Llama training step (LoRA by default, full fine-tune with
// --full-ft, FSDP over the world with --fsdp) timed by phase and by op, with the model FLOPs
// of the step, so that the next optimisation targets the largest share and so that the PyTorch
// comparison (bench/compare/) can use the same FLOP count.
#include <cstdint>

namespace dtr::bench {

/// Shape and run settings of the train-step benchmark. Defaults: SmolLM2-135M (30 layers,
/// hidden 576, intermediate 1536, 9 heads / 3 kv heads, head_dim 64, vocab 49152, tied
/// embeddings, rope theta 100000, rms eps 1e-5), seq 256, batch 4, LoRA r 8 alpha 16 on
/// q,k,v,o,gate,up,down.
struct TrainStepConfig {
  int64_t layers = 30, hidden = 576, intermediate = 1536, heads = 9, kv_heads = 3, vocab = 49152;
  int64_t seq = 256, batch = 4, lora_rank = 8;
  double lora_alpha = 16;
  int steps = 10, warmup = 2, threads = 0;  // threads 0: keep the runtime's setting
  bool full_ft = false, fsdp = false;
  std::string device = "cpu";  // cpu | cuda (each rank the GPU of its local rank)
};

/// Model FLOPs of one training step (per rank, for its local batch). Let T = batch * seq
/// tokens, L layers, H query heads, D head_dim, S seq, and N = the number of weights that
/// enter a matmul: every Linear of the decoder layers (q, k, v, o, gate, up, down) plus
/// lm_head (hidden * vocab, counted even when tied to the embedding; the embedding lookup and
/// the norms count 0). Attention scores count the full S x S square (no causal halving),
/// as PaLM (appendix B) and torchtitan do:
///   attention = 12 * L * H * D * S * T      (forward 4*L*H*D*S*T: QK^T and PV; backward 2x)
///   full fine-tune:  6 * N * T + attention
///   LoRA:            4 * N * T + 6 * T * sum over adapters of r * (in + out) + attention
///     (frozen base: forward 2NT + input gradients 2NT, no weight gradients; each adapter
///      x -> A [r, in] -> B [out, r] costs 2T r (in + out) forward and twice that backward)
/// Elementwise ops, norms, softmax, loss and the optimizer count 0.
double train_step_model_flops(const TrainStepConfig& c);

/// Best FLOP/s of dtr's f32 matmul at 1024^3 over 5 runs (the SGEMM peak MFU is measured against).
double sgemm_peak_flops();

/// Runs the benchmark (see apps/dtr_bench.cpp for the option list). Prints a per-phase table,
/// a per-op table and, as the last stdout line, one JSON object:
///   {"step_ms_median", "tokens_per_s", "model_flops_per_step", "model_flops_per_s",
///    "sgemm_peak_flops", "mfu", "peak_rss_mib", "cpu_ms_per_step", "phases": {"forward_ms",
///    "backward_ms", "optimizer_ms", "comm_exposed_ms", "other_ms"}, "op_families_ms": {family:
///    ms per step, e.g. "gemm", "attention"}, "config": {...}}
/// Phases are medians over the timed steps; forward / backward / optimizer exclude the exposed
/// communication measured inside them (FSDP waits), so the five phases add up to the step.
/// cpu_ms_per_step: user + system CPU time of rank 0 per timed step (a load-independent
/// measure of the work on shared machines; use --threads 1 for A/B comparisons).
/// Returns 0, or 2 on bad arguments.
int bench_train_step(int argc, char** argv);

}  // namespace dtr::bench
