#pragma once
// The Llama sidecar for parallelize_model (registered for "LlamaForCausalLM"): the TP plan with
// and without sequence parallelism, heads % tp validation, FSDP units per decoder layer and for
// trainable untied embeddings. Source: NeMo Automodel optimized_tp_plans._parallelize_llama,
// torchtitan's Llama TP plan.
#include "parallel/model_parallelizer.h"

namespace dtr {

class LlamaParallelizer : public ModelParallelizer {
 public:
  /// No SP: embed_tokens vocab-parallel (RowwiseParallel, output Replicate); q/k/v, gate/up
  /// ColwiseParallel; o/down RowwiseParallel; lm_head ColwiseParallel with Shard(-1) DTensor
  /// output feeding loss-parallel cross_entropy (logits never gathered).
  /// SP: embed_tokens output Shard(1); input/post_attention layernorms SequenceParallel with
  /// their output gathered once to Replicate for q/k/v and gate/up; o/down output Shard(1)
  /// (reduce_scatter); model.norm SequenceParallel; lm_head input Shard(1).
  ParallelizePlan tp_plan(nn::Module& model, const MeshContext& ctx) override;
  /// Errors: tp does not divide num_attention_heads or num_key_value_heads.
  void validate_tp_mesh(nn::Module& model, int64_t tp_size) override;
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> extra_units(nn::Module& model) override;
};

}  // namespace dtr
