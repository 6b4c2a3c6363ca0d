#pragma once
// The training loop of dtr-train.
//
// Step (one optimizer update over global_batch_size samples):
//   - the DistributedSampler gives every dp rank its contiguous slice of the same global batch;
//     the slice is cut into grad_accum micro-batches of local_batch_size;
//   - loss = token mean of next-token cross entropy over the whole global batch: micro-batch
//     mean losses are weighted by n_micro / N_global (label tokens of the micro-batch / of the
//     global batch, both known on every rank from the sampler) and by dp, because the data-
//     parallel gradient reduction averages over dp. So the gradient and the reported loss do not
//     depend on dp or accumulation;
//   - gradient sync only on the last micro-batch (the strategy finishes its reductions at the end of
//     each backward, nothing is called after it); clip_grad_norm over the
//     trainable parameters (optimizer.max_grad_norm, 0 = report the norm only); AdamW; LR step.
// Checkpoints (checkpoint.h) every ckpt_every_steps and at the end; a run resumes from the
// newest complete checkpoint under checkpoint_dir and continues the same loss trajectory.
#include <cstdint>
#include <string>

#include "apps/train/recipe.h"

namespace dtr::train {

struct TrainOptions {
  bool dry_run = false;
  /// --world-size N with --dry-run: plan for N ranks from one process (0 = the real world size).
  int64_t world_size = 0;
  /// > 0: leave the loop (without final save / export) once this global step is done, as if
  /// the job were killed there (tests of resume).
  int64_t stop_after = 0;
  /// Ignore existing checkpoints (start from step 0).
  bool no_resume = false;
  /// Remove the outputs of an earlier run that a run from step 0 would overwrite (else such a
  /// run refuses to start; see outputs.h).
  bool overwrite = false;
  /// Progress display: "auto" (\r line when stdout is a terminal and no launcher started the
  /// process; plain lines under mpirun / srun), "bar" or "lines"; "" = DTR_PROGRESS, else auto.
  std::string progress;
};

/// Runs dtr-train on this rank (dtr::init must have run). Returns the process exit code.
/// Recipe errors found before the model is allocated: rank 0 prints one line
/// "dtr-train: error: ..." and every rank returns 1. Errors during training: the rank prints
/// "[rank N] dtr-train: error: ..." and aborts the job.
int run_training(const Recipe& recipe, const TrainOptions& options);

}  // namespace dtr::train
