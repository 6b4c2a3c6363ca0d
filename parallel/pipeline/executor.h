#pragma once
// PipelineExecutor: runs one optimizer step's micro-batches through the pipeline stages this
// rank holds, in the order of a schedule (schedule.h). Each stage module takes one tensor and
// returns one (the first stage: token ids; the others: the previous stage's output; the last
// stage's output goes to the loss function). Between stages, outputs travel by send / recv on
// the pp group (p2p.h): after a forward the output is sent to the next stage's rank, before a
// forward the input is received; after a backward the input's gradient is sent back, before a
// backward the output's gradient is received. Sends are asynchronous and waited at the end of
// the step; a receive blocks only the micro-step that needs it, so any schedule whose order is
// deadlock-free on an ideal machine (simulate_pipeline_bubble) runs without deadlock.
// With targets (one per micro-batch) the last stage is called as call_list({input, targets})
// and returns the micro-batch's loss itself (a causal LM's fused head: the [tokens, vocab]
// logits are never formed); the loss function then receives that loss instead of the output.
// The loss function returns the scalar each micro-batch contributes to the step's objective
// (e.g. its token mean x its share of the global label tokens), so the gradients summed over
// micro-batches are those of the whole-batch objective, as without pipelining.
// Source: torch.distributed.pipelining PipelineScheduleSingle / PipelineScheduleMulti
// (_step_microbatches), Megatron-LM's p2p_communication.
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "parallel/pipeline/schedule.h"
#include "runtime/process_group.h"
#include "tensor/nn/module.h"

namespace dtr {

/// A stage this rank holds: its module and global stage index.
struct PipelineStage {
  std::shared_ptr<nn::Module> module;
  int stage_index = 0;
};

/// What one step measured on this rank.
struct PipelineStepStats {
  std::vector<PipelineAction> order;  // the micro-steps in the order they ran
  double compute_s = 0;               // inside stage forwards / backwards (loss included)
  double wait_s = 0;                  // blocked in receives
  double total_s = 0;                 // the whole step (final send waits included)
};

class PipelineExecutor {
 public:
  /// Loss of micro-batch `mb` from the last stage's output (a scalar that requires grad); with
  /// targets the output is the last stage's own loss of that micro-batch.
  using LossFn = std::function<Tensor(int mb, const Tensor& output)>;

  /// `stages`: the stages of this rank (pp rank r holds r, r + pp, ...; one for GPipe / 1F1B);
  /// `pp_group`: the pipeline group (group rank = pp rank). Errors: stages that are not this
  /// rank's under the loop placement, a stage count that does not match the schedule.
  PipelineExecutor(PipelineScheduleKind kind, std::vector<PipelineStage> stages, int num_stages,
                   std::shared_ptr<ProcessGroup> pp_group);

  /// Runs the schedule over `inputs.size()` micro-batches. `inputs[i]` is micro-batch i's input
  /// to stage 0 (read on the rank holding stage 0 only; other ranks may pass undefined tensors,
  /// but the vector's size gives m everywhere). Gradients accumulate into the parameters'
  /// .grad. Returns the losses of the micro-batches (detached) on the rank holding the last
  /// stage, an empty vector elsewhere. `targets`: empty, or micro-batch i's second input to the
  /// last stage (read on the rank holding it), which then returns the loss (see above).
  /// Errors: targets not one per micro-batch, an undefined target on the last stage.
  std::vector<Tensor> step(const std::vector<Tensor>& inputs, const LossFn& loss_fn,
                           const std::vector<Tensor>& targets = {});

  /// Evaluation: the forwards only (micro-batch by micro-batch, each rank's stages in order,
  /// which cannot deadlock), without autograd. Returns the losses as step() does; `targets` as
  /// for step().
  std::vector<Tensor> forward_only(const std::vector<Tensor>& inputs, const LossFn& loss_fn,
                                   const std::vector<Tensor>& targets = {});

  const PipelineStepStats& stats() const { return stats_; }
  PipelineScheduleKind kind() const { return kind_; }
  const std::vector<PipelineStage>& stages() const { return stages_; }
  int num_stages() const { return num_stages_; }

 private:
  std::vector<Tensor> run(const std::vector<PipelineAction>& actions, const std::vector<Tensor>& inputs,
                          const std::vector<Tensor>& targets, const LossFn& loss_fn, bool with_grad);

  PipelineScheduleKind kind_;
  std::vector<PipelineStage> stages_;
  int num_stages_ = 1;
  std::shared_ptr<ProcessGroup> pg_;
  PipelineStepStats stats_;
};

}  // namespace dtr
