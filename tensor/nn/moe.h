#pragma once
// Mixture-of-experts feed-forward block with Hugging Face (transformers 5) module names, so that
// state-dict keys equal Qwen3-MoE's / Mixtral's:
//   <mlp>.gate.weight            TopKRouter   [E, hidden]
//   <mlp>.experts.gate_up_proj   GroupedExperts [E, 2 * I, hidden]  (gate rows first, then up)
//   <mlp>.experts.down_proj                     [E, hidden, I]
//   <mlp>.shared_expert.*        optional module given by the model (e.g. its gated MLP)
//   <mlp>.shared_expert_gate     optional Linear [1, hidden] (Qwen2-MoE: sigmoid gate)
// Forward (dropless: every token reaches its top-k experts, no capacity factor):
//   logits = x Wr^T [N, E]; scores = softmax(logits) or sigmoid(logits) (computed in f32 for
//   bf16 / f16 inputs); top-k experts per token (ties: lower index first); weights = the top-k
//   scores, renormalised to sum 1 when norm_topk_prob; token copies sorted by expert (stable, so
//   by token within an expert: moe_permute); experts as two grouped_mm with SwiGLU between, each
//   copy's hidden row scaled by its weight (swiglu_weighted); each token's k outputs summed back
//   (moe_unpermute). With expert parallelism (a TokenDispatcher) the weights are applied in the
//   combine instead (the weighted moe_unpermute); + shared expert (times
//   sigmoid(shared_expert_gate(x))).
// Routing (top-k, sort, counts) runs on the host: the token counts per expert are needed there
// anyway (grouped_mm sizes, all-to-all splits); a CUDA input pays one copy of the scores.
// Expert parallelism plugs in through a TokenDispatcher (parallel/ provides one that moves tokens
// with all_to_all); without one, every expert is local.
// Source: transformers/models/qwen3_moe/modeling_qwen3_moe.py (Qwen3MoeTopKRouter,
// Qwen3MoeExperts, load_balancing_loss_func), mixtral, qwen2_moe (shared expert); torchtitan /
// Megatron-LM (grouped experts, token permutation); Switch Transformer (Fedus et al. 2021) eq.
// 4-6; ST-MoE (Zoph et al. 2022) router z-loss.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/nn/linear.h"
#include "tensor/nn/lora_linear.h"
#include "tensor/nn/module.h"

namespace dtr::nn {

struct MoERouting;  // the host routing of one forward (moe.cpp)

/// Settings of one MoE block (HF config names).
struct MoEConfig {
  int64_t hidden_size = 0;
  int64_t moe_intermediate_size = 0;  // I: each expert's intermediate width
  int64_t num_experts = 0;            // E (Mixtral: num_local_experts)
  int64_t num_experts_per_tok = 0;    // top-k
  bool norm_topk_prob = true;         // renormalise the top-k weights (Mixtral always does)
  std::string score_func = "softmax";  // softmax | sigmoid (DeepSeek-V3 style)
  std::string hidden_act = "silu";     // experts' activation (SwiGLU); only silu is built
  /// Checks sizes (> 0, top-k <= E), score_func and hidden_act; errors name the key.
  void validate() const;
};

/// What a router saw in its last forward, for the auxiliary losses (graph-connected tensors).
struct RouterStats {
  Shape tokens_per_expert;  // [E] top-k assignments per expert (host counts, sum = N * k)
  Tensor prob_sum;          // [E] sum over tokens of the scores (softmax; sigmoid: per-token normalised)
  Tensor z_sum;             // scalar: sum over tokens of logsumexp(logits)^2
  int64_t num_tokens = 0;   // N
};

/// Moves token copies sorted by (global) expert to the ranks holding those experts and back.
/// Implemented by parallel/ (expert parallelism over an "ep" mesh dim).
class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  /// x [M, H] sorted by expert with counts[e] rows for expert e (all E experts) -> the rows for
  /// this rank's experts, sorted by local expert, and their counts (E_local). Differentiable.
  virtual std::pair<Tensor, Shape> dispatch(const Tensor& x, const Shape& counts) = 0;
  /// The inverse of the last dispatch: y [rows dispatch returned, H] -> [M, H]. Differentiable.
  virtual Tensor combine(const Tensor& y) = 0;
  /// The local experts of a parameter [E, ...] as a plain tensor [E_local, ...] (differentiable).
  virtual Tensor local_experts(const Tensor& w) = 0;
};

/// The router: weight [E, hidden] (init zeros like HF's TopKRouter, or N(0, std) by the model).
/// forward is not used directly; MoE calls route().
class TopKRouter : public Module {
 public:
  TopKRouter(int64_t num_experts, int64_t hidden_size, DType dtype = DType::f32);
  std::string type_name() const override { return "TopKRouter"; }
  Tensor weight() const { return parameter("weight"); }
};

/// The experts, stored grouped: gate_up_proj [E, 2I, H], down_proj [E, H, I]. call_list({x, counts})
/// with x [M, H] sorted by expert and counts an int64 CPU tensor [E] (rows per expert) -> [M, H]:
/// down(silu(gate(x)) * up(x)) per expert through grouped_mm; call_list({x, counts, row_weights})
/// with row_weights [M] gives down(row_weights * silu(gate(x)) * up(x)) (no dispatcher: an error
/// with one). Called through call_list so that
/// FSDP's hooks run. With a dispatcher, x is first moved to the experts' ranks and back.
/// init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) like nn.Linear; false: zeros.
class GroupedExperts : public Module {
 public:
  GroupedExperts(int64_t num_experts, int64_t hidden_size, int64_t intermediate_size, DType dtype = DType::f32,
                 bool init = true);
  std::string type_name() const override { return "GroupedExperts"; }
  std::vector<Tensor> forward_list(const std::vector<Tensor>& inputs) override;
  void set_dispatcher(std::shared_ptr<TokenDispatcher> d) { dispatcher_ = std::move(d); }

  /// LoRA on the experts, one adapter pair per expert stored grouped, on both projections:
  ///   gate_up_proj_lora_A [E, r, H], gate_up_proj_lora_B [E, 2I, r],
  ///   down_proj_lora_A    [E, r, I], down_proj_lora_B    [E, H, r];
  /// W_e x becomes W_e x + scale * B_e (A_e x) (scale = lora_scale(o)); A drawn like LoRALinear's
  /// (xavier normal / kaiming uniform per expert, Philox), B zeros; the base experts are frozen.
  /// Errors: already enabled, dropout != 0 (not built for experts), r <= 0.
  void enable_lora(const LoraOptions& o);
  bool has_lora() const { return lora_scale_ != 0.0; }
  double lora_scaling() const { return lora_scale_; }
  const LoraOptions& lora_options() const { return lora_; }
  const std::shared_ptr<TokenDispatcher>& dispatcher() const { return dispatcher_; }

  const int64_t num_experts, hidden_size, intermediate_size;

 private:
  std::shared_ptr<TokenDispatcher> dispatcher_;
  LoraOptions lora_;
  double lora_scale_ = 0.0;
};

/// The MoE block. forward(x [..., hidden]) -> same shape. `shared_expert`: optional module
/// [.., hidden] -> [.., hidden] registered as "shared_expert"; `shared_expert_gate` adds the
/// Linear(hidden, 1) sigmoid gate on its output.
/// Errors: an invalid config; input last dim != hidden_size.
class MoE : public Module {
 public:
  MoE(const MoEConfig& c, DType dtype = DType::f32, bool init = true, std::shared_ptr<Module> shared_expert = nullptr,
      bool shared_expert_gate = false);
  std::string type_name() const override { return "MoE"; }
  Tensor forward(const Tensor& x) override;
  const MoEConfig& config() const { return config_; }
  std::shared_ptr<GroupedExperts> experts() const;
  std::shared_ptr<TopKRouter> gate() const;
  /// Router statistics of the last forward (empty before the first).
  const RouterStats& last_router_stats() const { return stats_; }
  /// How many times this block routed tokens (top-k on the host). An activation-checkpoint
  /// recomputation reuses the routing of the forward it recomputes instead of routing again, so
  /// recomputed scores that differ in the last bit cannot change the experts a token went to.
  int64_t routings() const { return routings_; }

 private:
  MoEConfig config_;
  RouterStats stats_;
  std::shared_ptr<const MoERouting> routing_;
  int64_t routings_ = 0;
};

/// The MoE blocks of a model, in module order.
std::vector<std::shared_ptr<MoE>> moe_modules(Module& model);

/// Load-balancing loss over the given router stats (HF load_balancing_loss_func, which is the
/// Switch / Mixtral formula with the layers' tokens concatenated):
///   f_e = sum_l tokens_per_expert_l[e] / sum_l N_l,  P_e = sum_l prob_sum_l[e] / sum_l N_l,
///   loss = E * sum_e f_e P_e     (sum_e f_e = k; uniform routing gives k).
/// Differentiable through prob_sum. Errors: no stats, stats of differing E.
Tensor load_balancing_loss(const std::vector<RouterStats>& stats);
/// Router z-loss: sum_l z_sum_l / sum_l N_l (mean over tokens of logsumexp(logits)^2).
Tensor router_z_loss(const std::vector<RouterStats>& stats);
/// aux_coef * load_balancing_loss + z_coef * router_z_loss over the MoE blocks of `model` (their
/// last forward); a coefficient of 0 skips its term; undefined when the model has no MoE block
/// or both coefficients are 0. Errors: grad mode on and a block whose statistics carry no graph
/// (it ran under no_grad, e.g. inside a fully checkpointed layer): the loss could not train the
/// router, which is not built (Megatron attaches it to the block's output instead).
Tensor moe_auxiliary_loss(Module& model, double aux_coef, double z_coef);

}  // namespace dtr::nn
