#pragma once
// The decoder-only causal language model shared by every family (Llama, Mistral, Qwen2, Qwen3,
// Gemma 3), with Hugging Face module names, so that state-dict keys equal transformers'
// (model.layers.3.self_attn.q_proj.weight):
//   model.embed_tokens                       Embedding [vocab, hidden] (Gemma: output * sqrt(hidden))
//   model.layers.N.input_layernorm           RMSNorm (Gemma: x * (1 + weight))
//   model.layers.N.self_attn                 Attention (attention.h: q/k/v/o_proj, q_norm / k_norm)
//   model.layers.N.post_attention_layernorm  RMSNorm: Llama family before the MLP; Gemma 3 after attention
//   model.layers.N.pre_feedforward_layernorm RMSNorm (Gemma 3)
//   model.layers.N.mlp.{gate,up,down}_proj   GatedMLP (mlp.h: SwiGLU or GeGLU)
//   model.layers.N.post_feedforward_layernorm RMSNorm (Gemma 3)
//   model.norm                               RMSNorm
//   lm_head                                  Linear [vocab, hidden], no bias; with
//                                            tie_word_embeddings its weight is the very
//                                            Tensor of model.embed_tokens.weight.
// Module type names carry the family's HF class prefix (Qwen3ForCausalLM, Qwen3DecoderLayer, ...);
// parallelize_model finds the family's sidecar by the root's type name.
// Source: transformers/models/{llama,mistral,qwen2,qwen3,gemma3}/modeling_*.py; torchtitan's
// "debug model" idea for tests.
#include <memory>
#include <string>

#include "models/formats/hf_config.h"
#include "models/transformer/attention.h"
#include "models/transformer/mlp.h"
#include "tensor/nn/embedding.h"
#include "tensor/nn/linear.h"
#include "tensor/nn/module_list.h"
#include "tensor/nn/moe.h"
#include "tensor/nn/rms_norm.h"

namespace dtr {

/// A tiny Llama for fast tests: vocab 128, hidden 64, intermediate 96, 2 layers,
/// 4 heads / 2 kv heads (head_dim 16), rope_theta 10000, rms eps 1e-6, max positions 128,
/// untied embeddings. tests/golden/make_llama_fixture.py builds the same config in HF.
ModelConfig llama_debug_config();

/// head_dim of `c` (config value, or hidden_size / num_attention_heads when 0).
int64_t llama_head_dim(const ModelConfig& c);

/// The family's HF class-name prefix of `c.model_type` ("Llama", "Qwen3", "Gemma3" ...).
std::string class_prefix(const ModelConfig& c);

/// The nn::MoE settings of a MoE family's config (Qwen3-MoE, Mixtral).
nn::MoEConfig moe_config(const ModelConfig& c);

/// The factor the input embedding is multiplied by: sqrt(hidden) rounded to f32 with
/// scale_embeddings (Gemma's Gemma3TextScaledWordEmbedding), 0 = none.
double embedding_scale(const ModelConfig& c);
/// final_logit_softcapping c > 0: c * tanh(logits / c); otherwise logits unchanged.
Tensor softcap_logits(const ModelConfig& c, const Tensor& logits);
/// The mean cross-entropy of a causal LM's head on `hidden` [B, T, H] (after the final norm)
/// against `targets` [B, T] int64 (ignore_index -100): lm_head.call_list({hidden, targets}), the
/// fused linear_cross_entropy (no [B, T, V] logits; its hooks see both inputs), or, for a head
/// that cannot fuse (final_logit_softcapping, a LoRA-wrapped or biased lm_head), the logits and
/// cross_entropy. Used by CausalLM::forward_list and the last pipeline stage (CausalLMStage).
Tensor lm_head_loss(const ModelConfig& c, nn::Module& lm_head, const Tensor& hidden, const Tensor& targets);

/// One decoder block. MoE families (ModelConfig::is_moe_layer): mlp is an nn::MoE
/// (mlp.gate.weight, mlp.experts.gate_up_proj / down_proj, transformers 5's names).
///  Llama family: h = x + attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h)).
///  Gemma 3 (sandwich_norms): h = x + post_attention_layernorm(attn(input_layernorm(x)));
///    out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))).
class DecoderLayer : public nn::Module {
 public:
  DecoderLayer(const ModelConfig& c, int64_t layer_idx, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return prefix_ + "DecoderLayer"; }
  Tensor forward(const Tensor& x) override;

 private:
  std::string prefix_;
  bool sandwich_;
};

/// embed_tokens (Gemma: * sqrt(hidden)) -> layers -> norm. Input ids [B, T] (int64 or int32) ->
/// hidden [B, T, hidden].
class DecoderModel : public nn::Module {
 public:
  explicit DecoderModel(const ModelConfig& c, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return prefix_ + "Model"; }
  Tensor forward(const Tensor& input_ids) override;
  std::shared_ptr<nn::ModuleList> layers() const;

 private:
  std::string prefix_;
  double embed_scale_;  // 0 = none
};

/// The causal LM. forward(input_ids [B, T] integer) -> logits [B, T, vocab] (dtype of the
/// parameters; with final_logit_softcapping c: c * tanh(logits / c)). Errors: ids not 2-D
/// integer, ids out of range (from embedding()).
class CausalLM : public nn::Module {
 public:
  /// Builds the module tree and, when `init` is true, draws weights like HF's _init_weights:
  /// every Linear / Embedding weight ~ N(0, initializer_range) (Philox, seeded by
  /// manual_seed), biases 0, norms 1 (0 with norm_offset, which scales by 1 + weight); with
  /// init = false weights are zeros and nothing is drawn (fast path for loading). Errors: an
  /// invalid config (ModelConfig::validate), rope_scaling other than none ("default").
  explicit CausalLM(const ModelConfig& c, DType dtype = DType::f32, bool init = true,
                    double initializer_range = 0.02);
  /// "<Family>ForCausalLM", e.g. "Qwen2ForCausalLM": the key of the family's ModelParallelizer.
  std::string type_name() const override { return class_prefix(config_) + "ForCausalLM"; }
  Tensor forward(const Tensor& input_ids) override;
  /// {input_ids} -> {logits}; {input_ids [B, T], targets [B, T] int64 (the target of each
  /// position, ignore_index -100)} -> {mean cross-entropy}: the logits are not formed, lm_head
  /// takes {hidden, targets} (nn::Linear's fused linear_cross_entropy, loss parallel under TP).
  /// A head that cannot fuse (final_logit_softcapping, a LoRA-wrapped or biased lm_head) takes
  /// forward's logits and cross_entropy. Hooks of the root and of lm_head see both inputs.
  std::vector<Tensor> forward_list(const std::vector<Tensor>& inputs) override;

  /// Mean causal-LM loss: causal_lm_loss(*this, input_ids, labels, shift) (fused head, no
  /// logits); MoE families add router_aux_loss_coef * nn::load_balancing_loss of the layers
  /// (HF's loss with output_router_logits).
  Tensor forward_loss(const Tensor& input_ids, const Tensor& labels, bool shift = true);

  /// Redraws every weight as described at the constructor.
  void init_weights(double initializer_range = 0.02);

  const ModelConfig& config() const { return config_; }
  std::shared_ptr<DecoderModel> model() const;
  bool tied() const { return config_.tie_word_embeddings; }

 private:
  ModelConfig config_;
};
/// The Llama family's name for CausalLM (the class was Llama-only before the families).
using LlamaForCausalLM = CausalLM;

/// Cross-entropy of next-token prediction, mean over targets != ignore_index.
/// logits [B, T, V], labels [B, T] int64. With `shift` (HF convention: labels = input ids)
/// position t predicts labels[t + 1]: uses logits[:, :-1] and labels[:, 1:]. Without shift,
/// labels are the targets of each position as given (llm.c convention).
/// Errors: shapes that disagree, labels not int64. All-ignored targets give 0 (the cross_entropy
/// kernels' count-0 rule; torch gives NaN), so does the fused causal_lm_loss below.
Tensor causal_lm_loss(const Tensor& logits, const Tensor& labels, bool shift = true, int64_t ignore_index = -100);

/// The same loss from the model itself, through its call (hooks: FSDP, TP, DDP): for a
/// CausalLM call_list({input_ids, targets}) with the fused head (no [B, T, V] logits; with
/// `shift` the targets are labels[:, 1:] and -100 at the last position, HF's shift_labels), for
/// any other module causal_lm_loss(model.call(input_ids), labels, shift). ignore_index -100.
/// Errors: as causal_lm_loss (shapes, labels not int64, shift with T < 2).
Tensor causal_lm_loss(nn::Module& model, const Tensor& input_ids, const Tensor& labels, bool shift = true);

}  // namespace dtr
