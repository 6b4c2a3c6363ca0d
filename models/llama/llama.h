#pragma once
// Llama-architecture causal language model with Hugging Face module names, so that
// state-dict keys equal transformers' (model.layers.3.self_attn.q_proj.weight):
//   model.embed_tokens                       Embedding [vocab, hidden]
//   model.layers.N.input_layernorm           RMSNorm
//   model.layers.N.self_attn.{q,k,v,o}_proj  Linear (GQA: k/v have num_key_value_heads heads)
//   model.layers.N.post_attention_layernorm  RMSNorm
//   model.layers.N.mlp.{gate,up,down}_proj   Linear (SwiGLU: down(silu(gate(x)) * up(x)))
//   model.norm                               RMSNorm
//   lm_head                                  Linear [vocab, hidden], no bias; with
//                                            tie_word_embeddings its weight is the very
//                                            Tensor of model.embed_tokens.weight.
// Source: transformers/models/llama/modeling_llama.py (LlamaForCausalLM); torchtitan's
// "debug model" idea for tests. No KV cache yet (training and scoring only).
#include <memory>
#include <utility>

#include "models/formats/hf_config.h"
#include "tensor/nn/embedding.h"
#include "tensor/nn/linear.h"
#include "tensor/nn/module_list.h"
#include "tensor/nn/rms_norm.h"

namespace dtr {

/// A tiny Llama for fast tests: vocab 128, hidden 64, intermediate 96, 2 layers,
/// 4 heads / 2 kv heads (head_dim 16), rope_theta 10000, rms eps 1e-6, max positions 128,
/// untied embeddings. tests/golden/make_llama_fixture.py builds the same config in HF.
LlamaConfig llama_debug_config();

/// head_dim of `c` (config value, or hidden_size / num_attention_heads when 0).
int64_t llama_head_dim(const LlamaConfig& c);

/// Self-attention with grouped-query heads and rotary embeddings (HF rotate-half layout).
/// Input [B, T, hidden] -> [B, T, hidden]. The number of query / kv heads used at forward
/// time is derived from the projections' output sizes (rows / head_dim), so tensor
/// parallelism can shard heads by sharding the projections; num_heads / num_kv_heads are
/// the counts this module holds (a TP plan rewrites them to local counts).
class LlamaAttention : public nn::Module {
 public:
  /// init: nn::Linear's default init; false: zeros (LlamaForCausalLM draws its own init).
  explicit LlamaAttention(const LlamaConfig& c, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return "LlamaAttention"; }
  Tensor forward(const Tensor& x) override;

  int64_t num_heads;
  int64_t num_kv_heads;
  const int64_t head_dim;
  const double rope_theta;

  /// KV cache for generation (inference only): when enabled, forward treats x as the tokens
  /// that follow the cached ones (RoPE positions continue from the cache length) and appends
  /// their keys / values; attention is causal, aligned bottom-right. Disabled by default.
  void enable_kv_cache(bool on);
  /// Cached positions (0 when disabled or reset).
  int64_t cache_length() const { return k_cache_.defined() ? k_cache_.size(2) : 0; }

 private:
  /// cos/sin [T, head_dim] for positions 0..T-1, cached for the last (T, dtype).
  std::pair<Tensor, Tensor> rope(int64_t T, DType dt);
  int64_t rope_T_ = -1;
  DType rope_dt_ = DType::f32;
  Tensor rope_cos_, rope_sin_;
  bool use_cache_ = false;
  Tensor k_cache_, v_cache_;  // [B, Hkv, S, D]
};

/// Turns the KV cache of every attention layer of `model` on (emptied) or off.
void enable_kv_cache(nn::Module& model, bool on);

/// SwiGLU feed-forward: down_proj(silu(gate_proj(x)) * up_proj(x)). [.., hidden] -> same.
class LlamaMLP : public nn::Module {
 public:
  explicit LlamaMLP(const LlamaConfig& c, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return "LlamaMLP"; }
  Tensor forward(const Tensor& x) override;
};

/// Pre-norm block: h = x + attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h)).
class LlamaDecoderLayer : public nn::Module {
 public:
  explicit LlamaDecoderLayer(const LlamaConfig& c, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return "LlamaDecoderLayer"; }
  Tensor forward(const Tensor& x) override;
};

/// embed_tokens -> layers -> norm. Input ids [B, T] (int64 or int32) -> hidden [B, T, hidden].
class LlamaModel : public nn::Module {
 public:
  explicit LlamaModel(const LlamaConfig& c, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return "LlamaModel"; }
  Tensor forward(const Tensor& input_ids) override;
  std::shared_ptr<nn::ModuleList> layers() const;
};

/// The causal LM. forward(input_ids [B, T] integer) -> logits [B, T, vocab] (dtype of the
/// parameters). Errors: ids not 2-D integer, ids out of range (from embedding()).
class LlamaForCausalLM : public nn::Module {
 public:
  /// Builds the module tree and, when `init` is true, draws weights like HF's _init_weights:
  /// every Linear / Embedding weight ~ N(0, initializer_range) (Philox, seeded by
  /// manual_seed), biases 0, norms 1; with init = false weights are zeros and nothing is
  /// drawn (fast path for loading). Errors: an invalid config (LlamaConfig::validate),
  /// rope_scaling other than none ("default"), hidden_act other than silu.
  explicit LlamaForCausalLM(const LlamaConfig& c, DType dtype = DType::f32, bool init = true,
                            double initializer_range = 0.02);
  std::string type_name() const override { return "LlamaForCausalLM"; }
  Tensor forward(const Tensor& input_ids) override;

  /// Mean causal-LM loss: forward(input_ids) then causal_lm_loss(logits, labels).
  Tensor forward_loss(const Tensor& input_ids, const Tensor& labels, bool shift = true);

  /// Redraws every weight as described at the constructor.
  void init_weights(double initializer_range = 0.02);

  const LlamaConfig& config() const { return config_; }
  std::shared_ptr<LlamaModel> model() const;
  bool tied() const { return config_.tie_word_embeddings; }

 private:
  LlamaConfig config_;
};

/// Cross-entropy of next-token prediction, mean over targets != ignore_index.
/// logits [B, T, V], labels [B, T] int64. With `shift` (HF convention: labels = input ids)
/// position t predicts labels[t + 1]: uses logits[:, :-1] and labels[:, 1:]. Without shift,
/// labels are the targets of each position as given (llm.c convention).
/// Errors: shapes that disagree, labels not int64. All-ignored targets give NaN (as in torch).
Tensor causal_lm_loss(const Tensor& logits, const Tensor& labels, bool shift = true, int64_t ignore_index = -100);

}  // namespace dtr
