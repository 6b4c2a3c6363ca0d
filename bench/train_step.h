#pragma once
// dtr-bench train-step: one training step of a decoder (the Llama of the shape flags by
// default; --model: any supported family from a config.json / .gguf / built-in shape; LoRA by
// default, full fine-tune with --full-ft, FSDP over the world with --fsdp) timed by phase and by
// op, with the model FLOPs of the step, so that the next optimisation targets the largest share
// and so that the PyTorch comparison (bench/compare/) can use the same FLOP count.
#include <cstdint>
#include <string>

#include "models/formats/hf_config.h"

namespace dtr::bench {

/// Shape and run settings of the train-step benchmark. Defaults: SmolLM2-135M (30 layers,
/// hidden 576, intermediate 1536, 9 heads / 3 kv heads, head_dim 64, vocab 49152, tied
/// embeddings, rope theta 100000, rms eps 1e-5), seq 256, batch 4, LoRA r 8 alpha 16 on
/// q,k,v,o,gate,up,down.
struct TrainStepConfig {
  /// Empty: the Llama of the shape flags below. Otherwise the model's config from a Hugging Face
  /// config.json (or a directory holding one), a .gguf file (metadata only: the weights stay
  /// random) or a built-in shape name (models/transformer/memory_plan.h); then `layers` replaces
  /// num_hidden_layers only when `layers_given` (layer_types cut to the first `layers`, so a
  /// Gemma 3 prefix keeps its 5:1 local / global pattern), and the other shape flags are unused.
  std::string model;
  bool layers_given = false;
  std::string save_config;  // non-empty: the resolved config.json written there (for the PyTorch side)
  int64_t layers = 30, hidden = 576, intermediate = 1536, heads = 9, kv_heads = 3, vocab = 49152;
  int64_t seq = 256, batch = 4, lora_rank = 8;
  double lora_alpha = 16;
  int steps = 10, warmup = 2, threads = 0;  // threads 0: keep the runtime's setting
  bool full_ft = false, fsdp = false;
  std::string device = "cpu";  // cpu | cuda (each rank the GPU of its local rank)
};

/// The model of the run: the Llama of the shape flags (SmolLM2-135M's defaults: tied, rope theta
/// 1e5, rms eps 1e-5), or `model` resolved as described at TrainStepConfig, with
/// max_position_embeddings >= seq. Errors: dtr::Error from the config readers (file, key).
ModelConfig train_step_model_config(const TrainStepConfig& c);

/// Model FLOPs of one training step (per rank, for its local batch). Let T = batch * seq
/// tokens, L layers, H query heads, D head_dim (the config's: not hidden / H for Qwen3 and
/// Gemma 3), S seq, and N = the number of weights that
/// enter a matmul: every Linear of the decoder layers (q [H*D, hidden], k, v [KV*D, hidden],
/// o [hidden, H*D], gate, up, down; SwiGLU and GeGLU alike) plus
/// lm_head (hidden * vocab, counted even when tied to the embedding; the embedding lookup and
/// the norms count 0). Attention scores count the full S x S square (no causal halving),
/// as PaLM (appendix B) and torchtitan do, except on sliding-window layers, which count the band
/// the kernel computes, S x min(S, window) (models/transformer/flops.h):
///   attention = 12 * H * D * T * sum over layers of (S or min(S, window))
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
///    "sgemm_peak_flops", "mfu", "peak_rss_mib", "cpu_ms_per_step", "loss" (last step),
///    "initial_loss" (first step, warm-up included), "phases": {"forward_ms",
///    "backward_ms", "optimizer_ms", "comm_exposed_ms", "other_ms"}, "op_families_ms": {family:
///    ms per step, e.g. "gemm", "attention"}, "config": {...}}
/// Phases are medians over the timed steps; forward / backward / optimizer exclude the exposed
/// communication measured inside them (FSDP waits), so the five phases add up to the step.
/// cpu_ms_per_step: user + system CPU time of rank 0 per timed step (a load-independent
/// measure of the work on shared machines; use --threads 1 for A/B comparisons).
/// Returns 0, or 2 on bad arguments.
int bench_train_step(int argc, char** argv);

}  // namespace dtr::bench
