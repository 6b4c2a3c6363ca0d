#pragma once
// The ModelParallelizer sidecar of the decoder families (each family file in models/families/
// registers it for its <Family>ForCausalLM): the TP plan with and without sequence parallelism,
// TP mesh validation, FSDP units per decoder layer and for trainable untied embeddings; the
// activation-checkpoint units are the decoder layers (the default).
// Source: NeMo Automodel optimized_tp_plans (_parallelize_llama, _parallelize_qwen), torchtitan's
// Llama / Qwen3 TP plans, vLLM's kv-head replication.
#include "models/formats/hf_config.h"
#include "parallel/model_parallelizer.h"

namespace dtr {

/// Checks that `c` can be split tp ways: num_attention_heads % tp == 0, and num_key_value_heads
/// % tp == 0 or tp % num_key_value_heads == 0 (kv heads replicated, KVReplicateParallel).
/// Errors: dtr::Error naming tp_size, the head counts and `source`.
void check_tp_heads(const ModelConfig& c, int64_t tp, const std::string& source);

class DecoderParallelizer : public ModelParallelizer {
 public:
  /// No SP: embed_tokens vocab-parallel (RowwiseParallel, output Replicate); q/k/v, gate/up
  /// ColwiseParallel (k/v KVReplicateParallel when tp > num_key_value_heads); o/down
  /// RowwiseParallel; q_norm / k_norm (Qwen3, Gemma 3) SequenceParallel on the heads dim (weights
  /// replicated, gradients reduced over tp); lm_head ColwiseParallel with Shard(-1) DTensor
  /// output feeding loss-parallel cross_entropy (logits never gathered).
  /// SP: embed_tokens output Shard(1); the norms before attention and MLP SequenceParallel with
  /// their output gathered once to Replicate for q/k/v and gate/up; o/down output Shard(1)
  /// (reduce_scatter); Gemma 3's norms after attention and MLP SequenceParallel (Shard(1));
  /// model.norm SequenceParallel; lm_head input Shard(1).
  ParallelizePlan tp_plan(nn::Module& model, const MeshContext& ctx) override;
  /// Errors: see check_tp_heads.
  void validate_tp_mesh(nn::Module& model, int64_t tp_size) override;
  /// A recipe's plan (distributed.tp_plan). Errors: k_proj / v_proj colwise while tp_size >
  /// num_key_value_heads (that would split a kv head; leave tp_plan unset: this sidecar replicates
  /// them); q_proj colwise on a q/k-norm model with no entry for self_attn.q_norm / k_norm (their
  /// gradients would miss the other ranks' heads: replicated_with_grad_allreduce).
  void check_tp_plan(nn::Module& model, const MeshContext& ctx, const ParallelizePlan& plan) override;
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> extra_units(nn::Module& model) override;
};
/// The Llama family's name for DecoderParallelizer.
using LlamaParallelizer = DecoderParallelizer;

}  // namespace dtr
