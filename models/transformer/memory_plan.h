#pragma once
// The memory and communication model of a training step, per rank, for any mesh, computed from
// the model's own module tree (built on meta tensors: exact parameter shapes, LoRA included) and
// the parallel settings; what `dtr-train --dry-run [--world-size N]` prints and what the tests
// check against formulas and measured bytes.
//
// Per rank (bytes):
//  - parameters: each tensor's TP-local shape (the decoder plan: q/k/v/gate/up/lm_head Shard(0),
//    o/down Shard(1), embed_tokens Shard(0) vocab, k/v replicated when tp > kv heads, norms
//    replicated; LoRA A/B as the LoRA styles place them), then FSDP's padded dim-0 chunk over
//    dp_shard (ceil(rows / dp_shard) rows); x storage dtype.
//  - gradients (sharded .grad) and AdamW state (exp_avg, exp_avg_sq): trainable shards x storage
//    dtype (x 2 for AdamW). ZeRO-3 mixed precision (bf16 params, f32 master + grads + Adam) gives
//    Rajbhandari et al.'s 16 * params / N.
//  - FSDP buffers: gathered units in param_dtype: the tables (root unit, untied trainable
//    embedding / head: never resharded after forward), the current layer + max(forward, backward
//    prefetch depth) layers, one all-gather output buffer of a layer; the unsharded gradients of
//    the unit in flight + the reduce-scatter input of the unit reduced before it in reduce_dtype
//    (fully_shard keeps one earlier reduction in flight, FSDP2's; all units' unsharded gradients
//    when defer_fsdp_grad_sync holds them over micro-batches, each freed once its unit is
//    reduced in the last one).
//  - activations of one micro-batch by AC policy, per layer and token, from what dtr's autograd
//    saves (no AC: the layer input, both normalised inputs, the residual, q / k / v after RoPE,
//    the attention output and its logsumexp, gate / up / SwiGLU output, LoRA A outputs);
//    selective: mm / bmm / sdpa outputs + layer inputs; full: layer inputs; both + one layer
//    recomputed in its backward. The loss through the fused head (linear_cross_entropy): per
//    chunk of min(tokens, 2^28 / (4 V)) rows its f32 logits [rows, vocab / tp] and their
//    gradient (2x; vocab-parallel under TP 6.25x: logits, target mask and the 5 temporaries of
//    dtensor/rules/loss.cpp's dlogits expression), and the input / head-weight gradients it forms.
//  - peak: params + optimizer state + the largest of the step's points: the loss (all kept
//    activations + the fused head's peak + gathered tables + last layer + the gradients kept from
//    earlier micro-batches), the backward of each layer (activations below it, its recomputation,
//    gathered layers in flight, gradients so far: the sharded .grad of the reduced units, the
//    previous unit's reduction in flight), end of backward (the sharded gradients + the last
//    units' reduce-scatter input: root and untied embedding), clip_grad_norm (all gradients
//    + the f64 copy and |g| of the largest local gradient); a .grad that accumulates (over
//    micro-batches, or a tied table's second contribution) briefly holds old + new + sum
//    (autograd/engine.cpp). Checked against the allocator's peak
//    of real steps in tests/models/mpi_test_memory_plan_measured.cpp (1-4 ranks, within 10%).
//  - load phase: the shards + under FSDP one parameter's shard read from the file (StepShape::from_file).
//  - comm per step and mesh dim (input bytes per call, as the process-group counters count):
//    FSDP all-gather (forward every unit, backward the resharded ones, per micro-batch),
//    reduce-scatter (per sync), HSDP all-reduce; TP all-reduce (or reduce-scatter + all-gather
//    under sequence parallelism) of [tokens, hidden] activations; DDP all-reduce of gradients.
// Source: ZeRO (Rajbhandari et al. 2020) for state; Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models") for the activation formula megatron_activation_bytes;
// FSDP2's buffer behaviour as fsdp_param_group.cpp implements it.
#include <map>
#include <string>
#include <vector>

#include "models/transformer/causal_lm.h"
#include "parallel/mesh_context.h"

namespace dtr {

/// Batch of one micro-step on one rank.
struct StepShape {
  int64_t local_batch = 1, seq_len = 1, grad_accum = 1;
  bool from_file = false;  // parameters read from a checkpoint (the load phase holds one read block)
};

/// Bytes one rank sends per step on one mesh dim, by collective.
struct CommVolume {
  double all_gather = 0, reduce_scatter = 0, all_reduce = 0;
  double send = 0;  // pipeline point-to-point (activations forward, their gradients backward)
  double total() const { return all_gather + reduce_scatter + all_reduce + send; }
};

/// The plan of one rank (bytes).
struct MemoryPlan {
  int64_t params = 0, trainable = 0;  // element counts of the whole model
  double param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  double fsdp_gathered_bytes = 0, fsdp_grad_bytes = 0;  // FSDP working set
  double activation_bytes = 0, logits_bytes = 0;
  double load_peak_bytes = 0;  // the load phase: the shards (+ one read block) + 1 MiB
  double peak_bytes = 0;       // params + optimizer + the largest of the step's points (above)
  double backward_peak_bytes = 0;  // params + optimizer + the largest backward point (pp: peak_bytes)
  std::map<std::string, CommVolume> comm;  // mesh dim ("dp_shard", "dp_replicate", "tp", "dp", "pp") -> bytes
  std::string note;  // pp: which rank the figures are and every pp rank's peak
  /// A multi-line table (what --dry-run prints).
  std::string str() const;
};

/// Plans `model` (built on meta tensors or not: only shapes are read) under `ctx` (validated;
/// its mesh need not exist) for `step`. `storage` is the parameters' dtype.
/// pp > 1: every pp rank is planned with its stages' parameters (stage_split.h's layer split,
/// the embedding on the first stage, final norm + lm_head on the last, a tied table on both)
/// and the activations of the micro-batches its schedule (schedule.h: GPipe all m, 1F1B
/// pp - rank, interleaved as listed) holds in flight, each of ctx.pipeline.microbatch_size
/// rows; the plan returned is the rank with the largest peak (MemoryPlan::note names it and
/// lists every rank's peak), comm "pp" the bytes it sends (each send's tensor held until the
/// step's end); FSDP in the stages keeps every unit
/// gathered (and its gradients unsharded) for the step, one all-gather / reduce-scatter per unit
/// and step (checked against real pipeline steps in mpi_test_memory_plan_measured). cp: tokens
/// / cp per rank.
/// Errors: a pipeline split the schedule does not take (PipelineConfig::stages_per_rank).
MemoryPlan plan_memory(CausalLM& model, const MeshContext& ctx, const StepShape& step, DType storage);

/// "12.34 MiB" below 1 GiB, "1.234 GiB" above.
std::string format_bytes(double bytes);

/// Korthikanti et al. 2022, eq. for one transformer layer without recomputation (16-bit
/// activations, 1-byte dropout masks, GPT with a 4h MLP): s b h (34 + 5 a s / h) bytes with
/// t = 1 and no sequence parallelism; s b h (10 + 24 / t + 5 a s / (h t)) with tensor parallelism
/// t; s b h (34 + 5 a s / h) / t with sequence parallelism.
double megatron_activation_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sp);

/// Built-in model shapes for planning (`model.config: <name>`): llama3_8b, llama3_70b,
/// llama3_405b, qwen3_32b, qwen3_30b_a3b (MoE), mixtral_8x7b (MoE); their HF config.json values.
/// Errors: an unknown name (lists the known ones).
ModelConfig builtin_model_config(const std::string& name);
/// Names of the built-in shapes.
std::vector<std::string> builtin_model_names();

}  // namespace dtr
