#pragma once
// dtr-train under pipeline parallelism (distributed.pp_size > 1): this rank's stages of the
// whole model (models/transformer/pipeline_stage.h), each parallelized on the rank's (dp, tp)
// slice, and the schedule that runs a step's micro-batches through them
// (parallel/pipeline/executor.h). The trainer keeps its loop; where it would call the model it
// calls this object: one step, the gradient norm over all stages, validation, the export.
#include <memory>
#include <vector>

#include "apps/train/checkpoint.h"
#include "models/data/sample.h"
#include "models/transformer/pipeline_stage.h"
#include "parallel/mesh_context.h"
#include "parallel/pipeline/executor.h"

namespace dtr::train {

class PipelinedModel {
 public:
  /// Splits `full` (distributed.pipeline: schedule, layers_per_stage) and parallelizes this
  /// rank's stages. Errors: see make_pipeline_stages, parallelize_pipeline_stage.
  PipelinedModel(std::shared_ptr<CausalLM> full, const MeshContext& ctx);

  /// This rank's trainable parameters (each once), by whole-model FQN.
  NamedParams trainable() const;
  /// One optimizer step's forward and backward: micro-batch k's loss is its token mean x
  /// `weights[k]` (the share of the global objective; 0-label micro-batches contribute 0).
  /// Gradients are reduced over dp and summed between the tied copies. Returns the sum over the
  /// micro-batches of token mean x label tokens, on every rank (0 where no label).
  double step(const std::vector<data::Batch>& mbs, const std::vector<double>& weights);
  /// clip_grad_norm over the whole model's gradients (summed over pp; the tied copy once).
  double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
  /// Validation: (sum of token mean x label tokens, label tokens) over `mbs`, on every rank.
  std::pair<double, double> evaluate(const std::vector<data::Batch>& mbs);
  /// Brings the trained values of every stage into `full` on pp rank 0 of each pp group (the
  /// others' copies stay stale) so that the exports read the whole model there. Collective.
  void gather_to_first_stage_rank();
  void train(bool mode);

 private:
  std::shared_ptr<CausalLM> full_;
  const MeshContext& ctx_;
  std::vector<std::shared_ptr<CausalLMStage>> stages_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::shared_ptr<ProcessGroup> pp_;
  int pp_rank_ = 0, stages_per_rank_ = 1;
  Tensor tied_;  // this rank's copy of the tied table (first or last stage), else undefined
  int tied_peer_ = 0;
};

}  // namespace dtr::train
