// The memory / communication model of a training step (see memory_plan.h).
#include "models/transformer/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "models/formats/hf_config.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage_split.h"
#include "tensor/error.h"

namespace dtr {
namespace {

bool ends(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Which tensor dim the decoder TP plan (models/transformer/parallelizer.cpp, the LoRA styles of
/// parallel/tensor_parallel/lora_styles.cpp) shards for parameter `fqn`, or -1 (replicated).
int64_t tp_dim(const std::string& fqn, const ModelConfig& c, int64_t tp) {
  if (tp == 1) return -1;
  const int64_t kv = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  if (has(fqn, "mlp.experts.") || has(fqn, "mlp.gate.") || has(fqn, "norm.")) return -1;  // experts: ep; norms: SP style
  const bool kv_proj = has(fqn, "k_proj") || has(fqn, "v_proj");
  if (kv_proj && tp > kv) return -1;  // KVReplicateParallel
  const bool colwise = has(fqn, "q_proj") || kv_proj || has(fqn, "gate_proj") || has(fqn, "up_proj") ||
                       fqn.rfind("lm_head", 0) == 0;
  const bool rowwise = has(fqn, "o_proj") || has(fqn, "down_proj");
  if (fqn.rfind("model.embed_tokens", 0) == 0) return 0;  // vocab parallel
  if (colwise) return 0;  // weight, bias, lora_A, lora_B: Shard(0)
  if (rowwise) return has(fqn, "bias") ? -1 : 1;  // weight, lora_A, lora_B Shard(1); bias replicated
  return -1;
}

/// FSDP unit of `fqn`: "model.layers.N", "embed" / "head" (untied trainable tables), or "" (root).
std::string unit_of(const std::string& fqn, bool own_tables) {
  const std::string pre = "model.layers.";
  if (fqn.rfind(pre, 0) == 0) return fqn.substr(0, fqn.find('.', pre.size()));
  if (own_tables && fqn.rfind("model.embed_tokens", 0) == 0) return "embed";
  if (own_tables && fqn.rfind("lm_head", 0) == 0) return "head";
  return "";
}

struct Unit {
  double shard = 0, grad_shard = 0;        // padded shard elements (all / trainable)
  double unsharded = 0, grad_unsharded = 0;  // TP-local elements
};

double bytes_of(DType d) { return static_cast<double>(itemsize(d)); }

}  // namespace

double megatron_activation_bytes(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, bool sp) {
  const double S = static_cast<double>(s), B = static_cast<double>(b), H = static_cast<double>(h),
               A = static_cast<double>(a), T = static_cast<double>(t);
  if (sp) return S * B * H * (34.0 + 5.0 * A * S / H) / T;
  return S * B * H * (10.0 + 24.0 / T + 5.0 * A * S / (H * T));
}

namespace {

/// What one pp rank holds: its stages' layer ranges (global stage = local * pp + rank), whether
/// it holds the first / last stage, and the schedule's micro-steps. pp 1: everything.
struct RankStages {
  std::vector<std::pair<int64_t, int64_t>> ranges;  // per local stage
  std::vector<int> global_stage;
  bool first = true, last = true;
  int num_stages = 1;
  std::vector<PipelineAction> actions;  // empty without pp
  double microbatches = 1;
  /// Layer index of a "model.layers.N..." name, or -1.
  static int64_t layer_of(const std::string& fqn) {
    const std::string pre = "model.layers.";
    if (fqn.rfind(pre, 0) != 0) return -1;
    return std::stoll(fqn.substr(pre.size(), fqn.find('.', pre.size()) - pre.size()));
  }
  bool holds_layer(int64_t l) const {
    for (const auto& [b, e] : ranges)
      if (l >= b && l < e) return true;
    return false;
  }
  /// Parameters on this rank: its layers, the embedding on the first stage, the final norm and
  /// lm_head on the last (a tied table on both: pipeline/tied_weights.h).
  bool holds(const std::string& fqn, bool tied) const {
    const int64_t l = layer_of(fqn);
    if (l >= 0) return holds_layer(l);
    if (fqn.rfind("model.embed_tokens", 0) == 0) return first || (last && tied);
    return last;
  }
};

MemoryPlan plan_rank(CausalLM& model, const MeshContext& ctx, const StepShape& st, DType storage, const RankStages& sv) {
  const ModelConfig& c = model.config();
  const int64_t tp = ctx.tp_size, ep = ctx.ep_size;
  const bool ddp = ctx.strategy == DataParallelStrategy::ddp;
  const bool mp = ctx.mp_policy.any_dtype();
  // parallelize_model's branches: FSDP over dp_shard_cp when dp x cp > 1 or a policy is set.
  const bool fsdp = !ddp && (ctx.dp_size * ctx.cp_size > 1 || mp);
  const int64_t dp_shard = fsdp ? ctx.dp_shard_cp_size() : 1;
  const DType pdt = ctx.mp_policy.param_dtype.value_or(storage);
  const DType rdt = ctx.mp_policy.reduce_dtype.value_or(pdt);
  const double S = bytes_of(storage), P = bytes_of(pdt), R = bytes_of(rdt);

  MemoryPlan plan;
  std::map<std::string, Unit> units;
  double max_local_param = 0, max_local_grad = 0;  // elements of the largest local shard (all / trainable)
  double head_grad = 0;  // TP-local elements of the trainable output table (lm_head, or the tied embedding)
  bool own_tables = false;
  if (!c.tie_word_embeddings)
    for (const auto& [fqn, p] : model.named_parameters())
      own_tables = own_tables || (p.requires_grad() && (fqn.rfind("model.embed_tokens", 0) == 0 || fqn.rfind("lm_head", 0) == 0));
  for (const auto& [fqn, p] : model.named_parameters()) {
    if (!sv.holds(fqn, c.tie_word_embeddings)) continue;
    Shape local = p.sizes();
    const int64_t d = tp_dim(fqn, c, tp);
    if (d >= 0 && d < static_cast<int64_t>(local.size())) local[d] = ceil_div(local[d], tp);
    if (ep > 1 && has(fqn, "mlp.experts.")) local[0] = ceil_div(local[0], ep);
    const int64_t rows = local.empty() ? 1 : local[0];
    int64_t row_numel = 1;
    for (size_t i = 1; i < local.size(); ++i) row_numel *= local[i];
    // Experts' FSDP runs over ep_shard = dp_shard / ep (their own unit, parallelize_model).
    const int64_t shard_n = ep > 1 && has(fqn, "mlp.experts.") ? std::max<int64_t>(1, dp_shard / ep) : dp_shard;
    const double tp_local = static_cast<double>(rows * row_numel);
    const double shard = static_cast<double>(ceil_div(rows, shard_n) * row_numel);
    plan.params += p.numel();
    max_local_param = std::max(max_local_param, shard);
    Unit& u = units[unit_of(fqn, own_tables)];
    u.shard += shard;
    u.unsharded += tp_local;
    plan.param_bytes += shard * S;
    if (p.requires_grad()) {
      plan.trainable += p.numel();
      max_local_grad = std::max(max_local_grad, shard);
      if (fqn.rfind("lm_head", 0) == 0 || (c.tie_word_embeddings && fqn.rfind("model.embed_tokens", 0) == 0))
        head_grad += tp_local;
      u.grad_shard += shard;
      u.grad_unsharded += tp_local;
      plan.grad_bytes += shard * S;
      plan.optimizer_bytes += 2.0 * shard * S;  // AdamW exp_avg + exp_avg_sq (parameter dtype)
    }
  }

  // FSDP working set.
  double max_layer = 0, max_layer_grad = 0, all_grad_unsharded = 0, max_layer_unit_shard = 0;
  for (const auto& [name, u] : units) {
    if (name.rfind("model.layers.", 0) == 0) {
      max_layer = std::max(max_layer, u.unsharded);
      max_layer_grad = std::max(max_layer_grad, u.grad_unsharded);
      max_layer_unit_shard = std::max(max_layer_unit_shard, u.shard);
    }
    all_grad_unsharded += u.grad_unsharded;
  }
  // Units never resharded after forward (the root, untied trainable tables) and their gradients.
  double tables = 0, tables_grad = 0;
  for (const char* n : {"", "embed", "head"})
    if (units.count(n)) {
      tables += units[n].unsharded;
      tables_grad += units[n].grad_unsharded;
    }
  const int depth = ctx.enable_fsdp2_prefetch ? std::max(ctx.fsdp2_forward_prefetch_depth, ctx.fsdp2_backward_prefetch_depth) : 0;
  const bool held = fsdp && ctx.defer_fsdp_grad_sync && st.grad_accum > 1;
  // FSDP reducing every micro-batch (defer_fsdp_grad_sync false; pp reduces after the last one):
  // the sharded .grad accumulate over the step's micro-batches.
  const bool sharded_persist = fsdp && !held && st.grad_accum > 1 && sv.actions.empty();
  if (fsdp) {
    // Tables + current layer + prefetched layers + one all-gather output buffer (a layer's).
    plan.fsdp_gathered_bytes = (tables + (1.0 + depth) * max_layer) * P + static_cast<double>(dp_shard) * max_layer_unit_shard * P;
    plan.fsdp_grad_bytes = held ? all_grad_unsharded * R + max_layer_grad * R : 2.0 * max_layer_grad * R;
  }
  // Activations of one micro-batch (elements per token per layer, this rank's TP share).
  // Context parallelism: each rank holds seq_len / cp tokens of a row.
  const int64_t rows = ctx.pp_size > 1 ? (ctx.pipeline.microbatch_size > 0 ? ctx.pipeline.microbatch_size : st.local_batch)
                                       : st.local_batch;
  const double T = static_cast<double>(rows * st.seq_len) / static_cast<double>(ctx.cp_size);
  const double t = static_cast<double>(tp), h = static_cast<double>(c.hidden_size);
  const int64_t kvh = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  const double hd = static_cast<double>(llama_head_dim(c));
  const double q = static_cast<double>(c.num_attention_heads) * hd / t;
  const double kv = static_cast<double>(kvh) * hd / (tp > kvh ? static_cast<double>(kvh) : t);
  const double heads = static_cast<double>(c.num_attention_heads) / t;
  const double resid = ctx.sequence_parallel ? h / t : h;  // residual stream (sequence shards under SP)
  double lora_r = 0;
  for (const auto& [fqn, p] : model.named_parameters())
    if (ends(fqn, "lora_A.weight") && has(fqn, "model.layers.0.")) lora_r += static_cast<double>(p.size(0));
  double dense_mlp = 0, sel_mlp = 0, moe_mlp = 0, sel_moe = 0;
  {
    const double I = static_cast<double>(c.intermediate_size) / t;
    dense_mlp = 3.0 * I;  // gate, up (SwiGLU inputs), SwiGLU output (down's input)
    sel_mlp = 2.0 * I + h;  // gate / up mm outputs, down's output
    if (c.num_experts > 0) {
      const double k = static_cast<double>(c.num_experts_per_tok), mi = static_cast<double>(c.moe_intermediate_size);
      moe_mlp = static_cast<double>(c.num_experts) + k * (h + 3.0 * mi);  // router scores, routed copies, expert gate/up/act
      sel_moe = static_cast<double>(c.num_experts) + k * (2.0 * mi + h);
    }
  }
  // Per layer (elements per token): what the forward keeps under the AC policy, and what the
  // backward of that layer holds on top (full / selective: the layer recomputed without AC).
  std::vector<double> kept, recomputed;
  std::vector<int64_t> mine;  // this rank's layers
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!sv.holds_layer(l)) continue;
    mine.push_back(l);
    const bool moe = c.is_moe_layer(l);
    // no AC: layer input, both normalised inputs, residual after attention, q / k after RoPE, v,
    // attention output + logsumexp, the MLP's saved inputs, LoRA A outputs (each adapted linear).
    double none = 2.0 * resid + 2.0 * h + q + 2.0 * kv + q + heads + (moe ? moe_mlp : dense_mlp) + lora_r;
    if (c.qk_norm) none += q + kv;  // q_norm / k_norm inputs
    if (c.sandwich_norms) none += 2.0 * resid;
    // selective: layer input + outputs of mm / bmm / sdpa (q / k / v, attention + lse, o_proj, MLP mms).
    const double sel = resid + q + 2.0 * kv + q + heads + h + (moe ? sel_moe : sel_mlp) + lora_r;
    if (ctx.activation_checkpointing == CheckpointPolicy::full) {
      kept.push_back(resid);
      recomputed.push_back(none);
    } else if (ctx.activation_checkpointing == CheckpointPolicy::selective) {
      kept.push_back(sel);
      recomputed.push_back(none);
    } else {
      kept.push_back(none);
      recomputed.push_back(0);
    }
  }
  const double final_acts = sv.last ? 2.0 * h : 0.0;  // final norm input + lm_head input
  double kept_all = final_acts, max_recomputed = 0;
  for (size_t l = 0; l < kept.size(); ++l) {
    kept_all += kept[l];
    max_recomputed = std::max(max_recomputed, recomputed[l]);
  }
  plan.activation_bytes = T * (kept_all + max_recomputed) * P;
  // The loss: dtr-train takes it through the fused head (linear_cross_entropy, causal_lm.h's
  // causal_lm_loss(model, ids, labels)): in the forward, per chunk of min(tokens, 2^28 / (4 V))
  // rows, the chunk's logits [rows, vocab / tp] (f32), their gradient written over them by the
  // one-pass loss + gradient kernel (1x; CPU, the plan's device: CUDA's cross_entropy + its
  // backward hold a second buffer, 2x); vocab-parallel under TP 6.25x (logits, target mask and
  // the 5 temporaries of dtensor/rules/loss.cpp's dlogits expression). The input gradient [tokens,
  // hidden] and the head's weight gradient are formed there and held until the backward.
  const double chunk_rows = std::min(T, std::max(16.0, std::floor(static_cast<double>(int64_t{1} << 28) /
                                                                  (4.0 * static_cast<double>(c.vocab_size)))));
  const double local_logits = chunk_rows * static_cast<double>(c.vocab_size) / t * std::max(P, 4.0);
  const double ce_peak = !sv.last ? 0.0 : tp > 1 ? 6.25 * local_logits : local_logits;
  plan.logits_bytes = ce_peak;

  // The step's peak over its phases (beyond params + optimizer state), each a point where the
  // allocator's live bytes are largest:
  //  - start of backward (cross_entropy's backward): every kept activation, the logits' peak,
  //    the gathered tables and the last layer (never resharded after forward);
  //  - backward of layer l (L-1 .. 0): kept activations of layers 0..l, layer l recomputed, the
  //    gathered tables, layer l + the prefetched layers, the gradients so far (FSDP, which keeps
  //    one earlier reduction in flight: layer l's unsharded gradient + the reduce-scatter input
  //    and output of the unit reduced before it, the sharded .grad of the units before that;
  //    otherwise the full gradients of layers >= l and the tables');
  //  - end of backward: the layers' sharded gradients + the units reduced last (root, untied
  //    embedding): their unsharded gradient and its chunk_cat copy;
  //  - clip_grad_norm: all gradients + the f64 copy and |g| of the largest local gradient.
  double layer_grad_shard = 0, layer_grad_full = 0;
  for (const auto& [name, u] : units)
    if (name.rfind("model.layers.", 0) == 0) {
      layer_grad_shard = std::max(layer_grad_shard, u.grad_shard);
      layer_grad_full = std::max(layer_grad_full, u.grad_unsharded);
    }
  const double head_grad_shard = units.count("head") ? units["head"].grad_shard : 0.0;  // reduced right after lm_head
  const double gathered_tables = fsdp ? tables * P : 0.0;
  const double gathered_layer = fsdp ? max_layer * P : 0.0;
  const double L = static_cast<double>(mine.size());
  const double G = fsdp ? R : S;
  // The fused head also holds its input gradient [tokens, hidden], f32 copies of a bf16 input and
  // weight [vocab / tp, hidden], and for a trainable head its f32 weight gradient (the chunks'
  // terms are added in place by the GEMM, addmm_).
  const double F = std::max(P, 4.0);
  const double head_rows = static_cast<double>(c.vocab_size) / t;
  const double head_dx = sv.last ? T * h * F + (P < 4.0 ? (T + head_rows) * h * F : 0.0) : 0.0;
  const double head_dw = sv.last && head_grad > 0 ? head_grad * F : 0.0;
  // Gradients kept from the step's earlier micro-batches: the unsharded ones held by
  // defer_fsdp_grad_sync, the sharded .grad when FSDP reduces every micro-batch, the full .grad
  // without FSDP.
  const double grads_held = held ? all_grad_unsharded * R
                                 : sharded_persist || (!fsdp && st.grad_accum > 1) ? plan.grad_bytes : 0.0;
  double peak = T * kept_all * P + ce_peak + gathered_tables + gathered_layer + head_dx + head_dw + grads_held;
  double bwd_peak = 0;  // the largest backward point (layers, the head's gradient, end of backward)
  if (!sv.actions.empty()) {
    // Pipeline: the kept activations of every micro-batch in flight on this rank (the schedule's
    // forwards minus backwards per local stage), then the backward point of one layer with every
    // gradient of the rank present (they accumulate over the micro-batches).
    std::vector<double> stage_kept(sv.ranges.size(), 0.0);
    for (size_t i = 0; i < sv.ranges.size(); ++i) {
      for (size_t j = 0; j < mine.size(); ++j)
        if (mine[j] >= sv.ranges[i].first && mine[j] < sv.ranges[i].second) stage_kept[i] += kept[j];
      if (sv.global_stage[i] == sv.num_stages - 1) stage_kept[i] += final_acts;
      stage_kept[i] *= T * P;
    }
    // Each send holds its tensor (a stage output or an input gradient, [tokens, hidden]) until
    // the step's end, where PipelineExecutor waits for the sends.
    double in_flight = 0, sent = 0, max_in_flight = 0;
    for (const PipelineAction& a : sv.actions) {
      size_t i = 0;
      while (i < sv.global_stage.size() && sv.global_stage[i] != a.stage) ++i;
      const bool fwd = a.type == PipelineAction::Forward;
      in_flight += fwd ? stage_kept[i] : -stage_kept[i];
      if (fwd ? a.stage + 1 < sv.num_stages : a.stage > 0) sent += T * resid * P;
      max_in_flight = std::max(max_in_flight, in_flight + sent);
    }
    plan.activation_bytes = max_in_flight + T * max_recomputed * P;
    // FSDP in stages (parallel/pipeline/stage_fsdp.h): every unit of the rank is gathered before
    // the first micro-batch and stays unsharded through the step (reshard_after_forward False),
    // gradients accumulate on the unsharded leaves, and after the last backward every unit's
    // reduce-scatter (input and output) is in flight at once before the reshard.
    double unsharded = 0, grad_shards = 0;
    for (const auto& [name, u] : units) unsharded += u.unsharded, grad_shards += u.grad_shard;
    const double gathered_all = fsdp ? unsharded * P : 0.0;
    const double grads = fsdp ? all_grad_unsharded * R + plan.grad_bytes : plan.grad_bytes;
    peak = max_in_flight + ce_peak + head_dx + gathered_all + T * max_recomputed * P + grads;
    if (fsdp) {
      plan.fsdp_gathered_bytes = gathered_all;
      plan.fsdp_grad_bytes = all_grad_unsharded * R;
      peak = std::max(peak, gathered_all + grads + (static_cast<double>(dp_shard) + 1.0) * grad_shards * R);
    }
  } else {
    double kept_below = T * kept_all * P - T * final_acts * P;
    for (size_t j = mine.size(); j-- > 0;) {
      const double done = L - 1.0 - static_cast<double>(j);  // layers whose backward finished
      double live = kept_below + T * recomputed[j] * P + gathered_tables;
      if (fsdp) {
        const double in_flight = std::min<double>(1.0 + depth, static_cast<double>(j) + 1.0);
        // fully_shard keeps one earlier reduction in flight (FSDP2): while layer j's gradient
        // forms, the unit reduced before it (layer j + 1, or the untied head) holds its chunk_cat
        // input (padded, dp_shard x its shard) and output; the units before that hold their
        // sharded .grad only (every unit's after the step's first micro-batch when reduced each).
        // Held over micro-batches (defer_fsdp_grad_sync), the unsharded gradients of the layers
        // not reduced yet stay too.
        const double prev = done >= 1.0 ? layer_grad_shard : head_grad_shard;
        const double applied = done >= 1.0 ? (done - 1.0) * layer_grad_shard + head_grad_shard : 0.0;
        live += in_flight * gathered_layer + (static_cast<double>(dp_shard) + 1.0) * prev * R +
                (sharded_persist ? plan.grad_bytes : applied * S) +
                (held ? std::max(0.0, all_grad_unsharded - done * layer_grad_full) * R : layer_grad_full * R);
      } else {
        live += ((done + 1.0) * layer_grad_full + tables_grad) * S;
      }
      bwd_peak = std::max(bwd_peak, live);
      kept_below -= T * kept[j] * P;
    }
  }
  // A leaf's .grad is accumulated out of place (autograd/engine.cpp: grad = grad + g): the old
  // gradient, the new one and their sum at once. That happens for the output table in lm_head's
  // backward when gradients persist over micro-batches (held by defer_fsdp_grad_sync, or no
  // FSDP), and for a tied trainable table in the embedding's backward (its second contribution).
  const bool persist = held || (!fsdp && st.grad_accum > 1);
  if (sv.last && head_grad > 0) {
    const double head = T * kept_all * P + head_dx + gathered_tables + gathered_layer + grads_held +
                        (persist ? 2.0 : 1.0) * head_grad * G;
    bwd_peak = std::max(bwd_peak, head);
  }
  // FSDP: the units reduced at the end of backward (the root, the untied embedding) form their
  // unsharded gradient and its chunk_cat copy (dp_shard x the padded shard) beside every other
  // unit's sharded .grad.
  double last_grad = 0, last_grad_shard = 0;
  for (const char* n : {"", "embed"})
    if (units.count(n)) {
      last_grad += units[n].grad_unsharded;
      last_grad_shard += units[n].grad_shard;
    }
  double bwd_end = fsdp ? gathered_tables + plan.grad_bytes - (sharded_persist ? 0.0 : last_grad_shard * S) +
                              (last_grad + static_cast<double>(dp_shard) * last_grad_shard) * R
                        : plan.grad_bytes;
  if (c.tie_word_embeddings && head_grad > 0 && sv.first)
    bwd_end = std::max(bwd_end, (fsdp ? plan.grad_bytes + gathered_tables + tables_grad * R : plan.grad_bytes) +
                                    2.0 * head_grad * G);
  const double clip = plan.grad_bytes + 2.0 * 8.0 * max_local_grad;  // abs(g.to(f64)): both f64 temporaries
  bwd_peak = std::max(bwd_peak, bwd_end);
  peak = std::max({peak, bwd_peak, clip});
  plan.peak_bytes = plan.param_bytes + plan.optimizer_bytes + peak;
  plan.backward_peak_bytes = sv.actions.empty() ? plan.param_bytes + plan.optimizer_bytes + bwd_peak : plan.peak_bytes;
  // Load: the shards, + under FSDP one parameter's shard read from the file before fully_shard
  // copies it into the flat shard (without FSDP the block is read into the parameter itself).
  plan.load_peak_bytes = plan.param_bytes + (st.from_file && fsdp ? max_local_param * S : 0.0) + (1 << 20);

  // Comm per step (pp: per micro-batch of the schedule).
  const double accum = sv.actions.empty() ? static_cast<double>(st.grad_accum) : sv.microbatches;
  // FSDP in pipeline stages (stage_fsdp.h): one all-gather and one reduce-scatter per unit and step.
  const bool stage_fsdp = !sv.actions.empty();
  if (fsdp && dp_shard > 1) {
    CommVolume& v = plan.comm[ctx.cp_size > 1 ? "dp_shard_cp" : "dp_shard"];
    const int64_t last_layer = mine.empty() ? -1 : mine.back();
    for (const auto& [name, u] : units) {
      // Forward gathers every unit; backward again the layers resharded after forward (all but the last).
      const bool resharded = name.rfind("model.layers.", 0) == 0 && name != "model.layers." + std::to_string(last_layer);
      const bool reshard = !stage_fsdp && ctx.reshard_after_forward.value_or(resharded) && !name.empty() &&
                           name != "embed" && name != "head";
      v.all_gather += (stage_fsdp ? 1.0 : accum) * (1.0 + (reshard ? 1.0 : 0.0)) * u.shard * P;
      const double syncs = ctx.defer_fsdp_grad_sync || stage_fsdp ? 1.0 : accum;
      if (u.grad_shard > 0) v.reduce_scatter += syncs * static_cast<double>(dp_shard) * u.grad_shard * R;
    }
    if (ctx.dp_replicate_size > 1) {
      double g = 0;
      for (const auto& [name, u] : units) g += u.grad_shard;
      plan.comm["dp_replicate"].all_reduce += (ctx.defer_fsdp_grad_sync || stage_fsdp ? 1.0 : accum) * g * R;
    }
  }
  if (ddp && ctx.dp_size > 1) {
    double g = 0;
    for (const auto& [name, u] : units) g += u.grad_unsharded;
    plan.comm["dp"].all_reduce += (ctx.defer_fsdp_grad_sync ? 1.0 : accum) * g * S;
  }
  if (tp > 1) {
    CommVolume& v = plan.comm["tp"];
    const double act = T * h * P;  // one [tokens, hidden] activation
    const double L = static_cast<double>(mine.size());
    // Per layer: o_proj and down outputs reduced (forward), the colwise blocks' input gradients
    // reduced (backward); plus the vocab-parallel embedding (forward) and lm_head's input gradient.
    // Under SP: forward reduce-scatters (embedding + o_proj / down) and all-gathers of sequence
    // shards (attention / MLP inputs + lm_head's input; each sends its shard's row count first,
    // one i64), backward the other way round; the norms' weight gradients (Partial over tp) are
    // all-reduced. Without SP: forward all-reduces (embedding + o_proj / down), backward one per
    // colwise linear's input gradient (q, k, v, gate, up: each its own) + lm_head's input.
    // Vocab-parallel cross_entropy: max and (sum exp, target logit) per row, f64, forward and
    // backward (dtensor/rules/loss.cpp).
    const double norms = (2.0 * L + (sv.last ? 1.0 : 0.0)) * h;
    if (ctx.sequence_parallel) {
      // Uneven sequence shards travel padded to ceil(seq / tp) rows each.
      const int64_t seq = st.seq_len / ctx.cp_size;
      const double padded = act * static_cast<double>(ceil_div(seq, tp) * tp) / static_cast<double>(seq);
      v.reduce_scatter += accum * 2.0 * (2.0 * L + 1.0) * padded;
      v.all_gather += accum * (2.0 * (2.0 * L + 1.0) * padded / t + (2.0 * L + 1.0) * 8.0);
      v.all_reduce += norms * S;
    } else {
      v.all_reduce += accum * (7.0 * L + 2.0) * act;
    }
    v.all_reduce += accum * 2.0 * 3.0 * 8.0 * T;
  }
  if (!sv.actions.empty()) {
    // Activations to the next stage (forward) and their gradients to the previous (backward).
    double sends = 0;
    for (int g : sv.global_stage) sends += (g + 1 < sv.num_stages ? 1.0 : 0.0) + (g > 0 ? 1.0 : 0.0);
    plan.comm["pp"].send += sv.microbatches * sends * T * resid * P;
  }
  return plan;
}

}  // namespace

MemoryPlan plan_memory(CausalLM& model, const MeshContext& ctx, const StepShape& st, DType storage) {
  if (ctx.pp_size <= 1) {
    RankStages all;
    all.ranges = {{0, model.config().num_hidden_layers}};
    all.global_stage = {0};
    return plan_rank(model, ctx, st, storage, all);
  }
  // Every pp rank planned; the plan is the rank with the largest peak.
  const int pp = static_cast<int>(ctx.pp_size);
  const int64_t L = model.config().num_hidden_layers;
  const int v = ctx.pipeline.stages_per_rank(L, pp, "distributed.pipeline");
  const std::vector<std::pair<int64_t, int64_t>> ranges =
      stage_layer_ranges(split_layers(L, pp * v, ctx.pipeline.layer_counts, "distributed.pipeline.layers_per_stage"));
  const int64_t rows = ctx.pipeline.microbatch_size > 0 ? ctx.pipeline.microbatch_size : st.local_batch;
  const int m = static_cast<int>(std::max<int64_t>(1, st.grad_accum * st.local_batch / rows));
  MemoryPlan best;
  std::string peaks;
  for (int r = 0; r < pp; ++r) {
    RankStages sv;
    sv.num_stages = pp * v;
    for (int k = 0; k < v; ++k) {
      const int g = k * pp + r;
      sv.global_stage.push_back(g);
      sv.ranges.push_back(ranges[g]);
    }
    sv.first = r == 0;
    sv.last = (v - 1) * pp + r == pp * v - 1;
    sv.microbatches = m;
    sv.actions = pipeline_schedule(ctx.pipeline.schedule, {pp, v, m}, r);
    MemoryPlan p = plan_rank(model, ctx, st, storage, sv);
    peaks += (r ? ", " : "") + format_bytes(p.peak_bytes);
    if (r == 0 || p.peak_bytes > best.peak_bytes) {
      best = p;
      best.note = "pp rank " + std::to_string(r);
    }
  }
  // Whole-model counts (each rank's plan counts its stages' parameters only).
  best.params = 0;
  best.trainable = 0;
  for (const auto& [fqn, p] : model.named_parameters()) {
    best.params += p.numel();
    if (p.requires_grad()) best.trainable += p.numel();
  }
  best.note = "pipeline " + std::string(pipeline_schedule_name(ctx.pipeline.schedule)) + ", " + std::to_string(m) +
              " micro-batches of " + std::to_string(rows) + " rows: figures are " + best.note +
              "'s (the largest peak); peaks by pp rank: " + peaks;
  return best;
}

std::string format_bytes(double b) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(b >= 1024.0 * 1024.0 * 1024.0 ? 3 : 2);
  if (b >= 1024.0 * 1024.0 * 1024.0) o << b / (1024.0 * 1024.0 * 1024.0) << " GiB";
  else o << b / (1024.0 * 1024.0) << " MiB";
  return o.str();
}

std::string MemoryPlan::str() const {
  const auto f = format_bytes;
  std::ostringstream o;
  o << "memory per rank: params " << f(param_bytes) << ", grads " << f(grad_bytes) << ", optimizer "
    << f(optimizer_bytes) << ", FSDP gathered " << f(fsdp_gathered_bytes) << ", FSDP unsharded grads "
    << f(fsdp_grad_bytes) << ", activations " << f(activation_bytes) << ", logits " << f(logits_bytes)
    << "\n  peak (train step) " << f(peak_bytes) << ", load phase " << f(load_peak_bytes) << "\n";
  o << "comm per step and rank (bytes sent):";
  if (comm.empty()) o << " none";
  for (const auto& [dim, v] : comm)
    o << "\n  " << dim << ": all_gather " << f(v.all_gather) << ", reduce_scatter " << f(v.reduce_scatter)
      << ", all_reduce " << f(v.all_reduce) << (v.send > 0 ? ", send " + f(v.send) : std::string());
  o << "\n";
  if (!note.empty()) o << "note: " << note << "\n";
  return o.str();
}

namespace {

struct Builtin {
  const char* name;
  const char* json;
};
// HF config.json values (rope_scaling left out: it does not change memory or comm, and dtr
// builds no llama3 RoPE scaling yet).
const Builtin kBuiltins[] = {
    {"llama3_8b", R"({"model_type":"llama","vocab_size":128256,"hidden_size":4096,"intermediate_size":14336,
      "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"max_position_embeddings":131072,
      "rope_theta":500000.0,"rms_norm_eps":1e-5,"tie_word_embeddings":false})"},
    {"llama3_70b", R"({"model_type":"llama","vocab_size":128256,"hidden_size":8192,"intermediate_size":28672,
      "num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,"max_position_embeddings":131072,
      "rope_theta":500000.0,"rms_norm_eps":1e-5,"tie_word_embeddings":false})"},
    {"llama3_405b", R"({"model_type":"llama","vocab_size":128256,"hidden_size":16384,"intermediate_size":53248,
      "num_hidden_layers":126,"num_attention_heads":128,"num_key_value_heads":8,"max_position_embeddings":131072,
      "rope_theta":500000.0,"rms_norm_eps":1e-5,"tie_word_embeddings":false})"},
    {"qwen3_32b", R"({"model_type":"qwen3","vocab_size":151936,"hidden_size":5120,"intermediate_size":25600,
      "num_hidden_layers":64,"num_attention_heads":64,"num_key_value_heads":8,"head_dim":128,
      "max_position_embeddings":40960,"rope_theta":1000000.0,"rms_norm_eps":1e-6,"tie_word_embeddings":false})"},
    {"qwen3_30b_a3b", R"({"model_type":"qwen3_moe","vocab_size":151936,"hidden_size":2048,"intermediate_size":6144,
      "moe_intermediate_size":768,"num_experts":128,"num_experts_per_tok":8,"norm_topk_prob":true,
      "decoder_sparse_step":1,"mlp_only_layers":[],"num_hidden_layers":48,"num_attention_heads":32,
      "num_key_value_heads":4,"head_dim":128,"max_position_embeddings":40960,"rope_theta":1000000.0,
      "rms_norm_eps":1e-6,"tie_word_embeddings":false})"},
    {"mixtral_8x7b", R"({"model_type":"mixtral","vocab_size":32000,"hidden_size":4096,"intermediate_size":14336,
      "num_local_experts":8,"num_experts_per_tok":2,"num_hidden_layers":32,"num_attention_heads":32,
      "num_key_value_heads":8,"max_position_embeddings":32768,"rope_theta":1000000.0,"rms_norm_eps":1e-5,
      "tie_word_embeddings":false})"},
};

}  // namespace

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> out;
  for (const auto& b : kBuiltins) out.push_back(b.name);
  return out;
}

ModelConfig builtin_model_config(const std::string& name) {
  for (const auto& b : kBuiltins)
    if (name == b.name) return model_config_from_json(nlohmann::json::parse(b.json), std::string("built-in ") + b.name);
  std::string known;
  for (const auto& n : builtin_model_names()) known += (known.empty() ? "" : ", ") + n;
  DTR_ERROR("model.config: unknown built-in shape '", name, "' (known: debug, ", known, ")");
}

}  // namespace dtr
