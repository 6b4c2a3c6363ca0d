#pragma once
// Self-attention shared by every family, with the options they differ in:
//   q/k/v bias (Qwen2; Llama / Qwen3 / Gemma 3 attention_bias), o_proj bias,
//   per-head q_norm / k_norm RMSNorm over head_dim before RoPE (Qwen3; Gemma 3 with 1 + weight),
//   a sliding window per layer (Mistral; Qwen with use_sliding_window; Gemma 3 local layers),
//   the RoPE base per layer (Gemma 3: rope_local_base_freq on sliding layers),
//   the scale query_pre_attn_scalar^-0.5 (Gemma 3; default head_dim^-0.5),
//   head_dim independent of hidden_size / heads.
// Modules (HF names): q_proj [Hq*D, hidden], k_proj / v_proj [Hkv*D, hidden], o_proj [hidden, Hq*D],
// q_norm / k_norm [D] when qk_norm. Grouped-query attention, RoPE in the HF rotate-half layout.
// Source: transformers/models/{llama,qwen2,qwen3,mistral,gemma3}/modeling_*.py (*Attention).
#include <string>
#include <utility>

#include "models/formats/hf_config.h"
#include "parallel/context_parallel.h"
#include "tensor/nn/module.h"

namespace dtr {

/// Input [B, T, hidden] -> [B, T, hidden]. The number of query / kv heads used at forward time is
/// derived from the projections' output sizes (rows / head_dim), so tensor parallelism can shard
/// heads by sharding the projections (or hand each rank the kv head it shares, see
/// models/transformer/parallelizer.h); num_heads / num_kv_heads are the model's counts.
/// Context parallelism (set_context_parallel, from parallelize_model): x holds this rank's
/// load-balanced slice of each sequence; RoPE takes the slice's global positions and attention runs
/// over the K/V of the whole cp group (context_parallel_attention).
class Attention : public nn::Module, public ContextParallelModule {
 public:
  /// Layer `layer_idx` of config `c` (its layer type picks the window and RoPE base).
  /// init: nn::Linear's default init; false: zeros (CausalLM draws its own init).
  Attention(const ModelConfig& c, int64_t layer_idx, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return prefix_ + "Attention"; }
  Tensor forward(const Tensor& x) override;

  const int64_t num_heads;
  const int64_t num_kv_heads;
  const int64_t head_dim;
  const double rope_theta;      // this layer's RoPE base
  const int64_t window;         // sliding window of this layer, 0 = none
  const double scale;           // softmax scale
  const bool qk_norm;

  /// KV cache for generation (inference only): when enabled, forward treats x as the tokens
  /// that follow the cached ones (RoPE positions continue from the cache length) and appends
  /// their keys / values; attention is causal, aligned bottom-right. Disabled by default.
  void enable_kv_cache(bool on);
  void set_context_parallel(std::shared_ptr<ProcessGroup> cp_group) override;
  /// Cached positions (0 when disabled or reset).
  int64_t cache_length() const { return k_cache_.defined() ? k_cache_.size(2) : 0; }

  /// Documents of the rows the next forward passes run (sequence packing): position_ids and
  /// document_ids i64 [B, T] (data::Batch's). RoPE then takes each token's position_ids entry and
  /// attention is causal within each document only (SdpaMask::q_document_ids), so a packed row
  /// computes what its documents compute alone. Kept until the next call (activation
  /// checkpointing recomputes with the same documents); undefined tensors = none (positions
  /// 0..T-1, plain causal). Errors at forward: shapes other than x's [B, T]; with the KV cache.
  void set_documents(const Tensor& position_ids, const Tensor& document_ids);

 private:
  /// cos/sin [T, head_dim] for positions 0..T-1 (under context parallelism the T global
  /// positions of this rank's slice), cached for the last (T, dtype).
  std::pair<Tensor, Tensor> rope(int64_t T, DType dt);
  std::string prefix_;
  int64_t rope_T_ = -1;
  DType rope_dt_ = DType::f32;
  Tensor rope_cos_, rope_sin_;
  bool use_cache_ = false;
  Tensor k_cache_, v_cache_;  // [B, Hkv, S, D]
  std::shared_ptr<ProcessGroup> cp_;  // context parallelism (size > 1), else null
  Tensor position_ids_, document_ids_;  // set_documents
  Tensor doc_cos_, doc_sin_;            // rope_tables(position_ids_) for doc_dt_, built at first use
  DType doc_dt_ = DType::f32;
};

/// Turns the KV cache of every attention layer of `model` on (emptied) or off.
void enable_kv_cache(nn::Module& model, bool on);

/// Attention::set_documents on every attention layer of `model` (undefined tensors: none).
void set_attention_documents(nn::Module& model, const Tensor& position_ids, const Tensor& document_ids);

}  // namespace dtr
