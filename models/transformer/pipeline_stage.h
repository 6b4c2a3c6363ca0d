#pragma once
// A pipeline stage of a causal LM: the modules of one stage taken from the whole model (shared,
// not copied), under the whole model's FQNs so that TP plans, FSDP units, LoRA names and
// checkpoints read the same on every pp size:
//   first stage:  model.embed_tokens, model.layers.<i> ...       input ids [B, T] -> hidden [B, T, H]
//   middle:       model.layers.<i> ...                           hidden -> hidden
//   last stage:   model.layers.<i> ..., model.norm, lm_head      hidden -> logits [B, T, V],
//                 or {hidden, targets [B, T]} -> mean loss through the fused head (lm_head_loss)
// (one stage holding everything is the whole model). Layer i keeps its name "model.layers.<i>".
// With tie_word_embeddings the first and last stage hold the same tensor when they are one
// module, and two equal copies on two ranks otherwise (parallel/pipeline/tied_weights.h keeps
// them equal). Source: torchtitan / Automodel pipeline_module_split (layers deleted from a copy,
// FQNs kept), HF's modeling_llama for the forward.
#include <memory>
#include <vector>

#include "models/transformer/causal_lm.h"

namespace dtr {

class CausalLMStage : public nn::Module {
 public:
  /// Takes layers [layer_begin, layer_end) of `full`, its embedding when `first`, its final norm
  /// and lm_head when `last`. Errors: an empty or out-of-range layer range.
  CausalLMStage(CausalLM& full, int64_t layer_begin, int64_t layer_end, bool first, bool last);
  /// The whole model's type name ("<Family>ForCausalLM"), so parallelize_model finds the family's
  /// parallelizer.
  std::string type_name() const override { return class_prefix(config_) + "ForCausalLM"; }
  /// first: ids [B, T] integer; otherwise hidden [B, T, H]. Returns logits (last) or hidden.
  Tensor forward(const Tensor& x) override;
  /// {x} -> {forward(x)}; on the last stage {x, targets [B, T] int64 (ignore_index -100)} ->
  /// {mean cross-entropy} through lm_head_loss (the fused head: no [B, T, V] logits), as
  /// CausalLM::forward_list({input_ids, targets}). Errors: targets on another stage, targets not
  /// [B, T] int64 with x's B.
  std::vector<Tensor> forward_list(const std::vector<Tensor>& inputs) override;

  const ModelConfig& config() const { return config_; }
  bool is_first() const { return first_; }
  bool is_last() const { return last_; }
  int64_t layer_begin() const { return begin_; }
  int64_t layer_end() const { return end_; }

 private:
  /// The stage's body: embedding (first), its layers, the final norm (last).
  Tensor hidden(const Tensor& x);

  ModelConfig config_;
  bool first_, last_;
  int64_t begin_, end_;
};

/// The stages of pipeline rank `pp_rank` (ctx.pp_size ranks, `stages_per_rank` stages each,
/// loop placement: stage s on rank s % pp), layers split by split_layers(`layer_counts`).
/// Errors: see split_layers (`where` names the recipe section).
std::vector<std::shared_ptr<CausalLMStage>> make_pipeline_stages(CausalLM& full, int pp_size, int pp_rank,
                                                                 int stages_per_rank,
                                                                 const std::vector<int64_t>& layer_counts,
                                                                 const std::string& where);

/// The tied weight of a stage under tie_word_embeddings: the first stage's embedding, the last
/// stage's lm_head (the first when a stage is both). Undefined for other stages and untied models.
Tensor tied_stage_weight(CausalLMStage& stage);

}  // namespace dtr
