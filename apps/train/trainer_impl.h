#pragma once
// dtr-train's Trainer (internal to dtr_train): one rank's state and the steps of the job, one
// file per concept:
//   trainer.cpp             run_training, Trainer::run (the flow), finish_run
//   trainer_setup.cpp       setup_model, setup_optimizer (AdamW, sampler, LR schedule), setup_metrics
//   trainer_step.cpp        make_batch, micro_batch, train_step (the optimizer step)
//   trainer_validation.cpp  validate, validate_and_log, validation_due
//   trainer_logging.cpp     RankMemory, log_step (metrics.jsonl, progress line, warnings)
//   trainer_checkpoint.cpp  checkpoint_due, save, resume, already_complete
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apps/train/health.h"
#include "apps/train/pipeline_model.h"
#include "apps/train/progress.h"
#include "apps/train/recipe.h"
#include "apps/train/setup.h"
#include "apps/train/trainer.h"
#include "models/data/sample.h"
#include "models/data/sampler.h"
#include "runtime/env.h"
#include "tensor/optim/adamw.h"
#include "tensor/optim/lr_scheduler.h"

namespace dtr::train::detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Memory of this rank, max over the ranks (collective): live allocator bytes (peak since the
/// last reset), the CPU allocator's cached bytes, resident set and its high-water mark.
struct RankMemory {
  int64_t live_peak = 0, cached = 0, rss = 0, rss_peak = 0;
  static RankMemory max_over_ranks();
};

/// The value of a scalar loss (plain or distributed).
double scalar_value(const Tensor& t);

/// Sum of `v` over the ranks that hold other tokens: data-parallel and context-parallel ranks.
double dp_sum(const MeshContext& ctx, double v);

/// all[idx[begin]], ..., all[idx[begin + count - 1]].
std::vector<data::Sample> gather(const std::vector<data::Sample>& all, const std::vector<int64_t>& idx, size_t begin,
                                 size_t count);

/// One optimizer step's figures, the same on every rank (sums over dp x cp).
struct StepResult {
  double loss = NAN, grad_norm = NAN, lr = 0;
  double step_tokens = 0;      // positions run, padding included
  double dispatch_bytes = -1;  // expert parallelism: the ep all-to-alls' bytes (-1 without ep)
  int64_t label_tokens = 0, epoch = 0;
  bool updated = false;  // false: skipped by on_nonfinite: skip
  double seconds = 0;
};

/// dtr-train on one rank. run() reads as the job does: setup (mesh, model, optimizer, schedule),
/// resume, then per step train_step (micro-batches, gradient reduction, clipping, AdamW) ->
/// evaluate when due -> log_step -> checkpoint when due, then the end of the run (last
/// validation and checkpoint, exports).
struct Trainer {
  const Recipe& r;
  const TrainOptions& opt;
  Plan& plan;
  std::vector<data::Sample>& train_set;
  std::vector<data::Sample>& val_set;
  int32_t pad_id = 0;
  int rank = 0, world = 1;

  Trainer(const Recipe& recipe, const TrainOptions& options, Plan& p, std::vector<data::Sample>& train,
          std::vector<data::Sample>& val, int32_t pad, int rank_, int world_)
      : r(recipe), opt(options), plan(p), train_set(train), val_set(val), pad_id(pad), rank(rank_), world(world_) {}

  // Built by the setup steps.
  std::unique_ptr<DeviceMesh> world_mesh;
  std::unique_ptr<ProgressPrinter> progress;
  std::shared_ptr<LlamaForCausalLM> model;
  NamedParams params;          // trainable, with FQNs (checkpoints)
  std::vector<Tensor> plist;   // the same tensors (optimizer, clipping)
  double trainable_active = 0;  // MoE: a token uses k of E experts (flops.h)
  ProcessGroup* ep_group = nullptr;  // expert parallelism: the ep all-to-all counters
  RankMemory load_memory;            // the load phase's peak (max over ranks)
  /// distributed.pp_size > 1: this rank's pipeline stages, which replace the model's calls.
  std::unique_ptr<PipelinedModel> pipe;
  std::unique_ptr<optim::AdamW> optimizer;
  std::unique_ptr<data::DistributedSampler> sampler;
  std::unique_ptr<optim::LRScheduler> sched;
  int64_t total_steps = 0;
  // The loop's state.
  int64_t step = 0, first_step = 0, last_saved = 0, last_val_step = -1;
  double last_loss = NAN, last_val = NAN;
  std::unique_ptr<MetricsWriter> metrics;
  double peak_flops = 0;
  Clock::time_point t_loop;

  const MeshContext& ctx() const { return plan.mesh; }
  bool has_val() const { return r.validation_dataset.enabled && !val_set.empty(); }
  void note(const std::string& s) {
    if (rank == 0) progress->note(s);
  }

  /// The job: setup, resume, the step loop, finish_run. Returns the exit code (trainer.cpp).
  int run();

  // --- setup (trainer_setup.cpp)
  /// The mesh, the model (built, the recipe's TP plan checked, parallelized) and its trainable
  /// parameters.
  void setup_model();
  /// AdamW over the trainable parameters, the data sampler, the step count and the LR schedule.
  void setup_optimizer();
  /// metrics.jsonl (rank 0) and the FLOP peak MFU is measured against: logging.peak_tflops per
  /// rank, or a start-up SGEMM only when asked (peak_tflops: measure; a measurement on a loaded
  /// machine is not a peak). None: no MFU.
  void setup_metrics();

  // --- the optimizer step (trainer_step.cpp)
  /// Packed rows are full already and carry their documents (position / document ids, handed
  /// to the attention layers: per-document RoPE and a block-diagonal causal mask); unpacked ones
  /// are padded to the micro-batch's longest sample, rounded up to pad_seq_len_divisible and
  /// capped at seq_len.
  /// Context parallelism: rows are padded to a multiple of 2 cp as well (seq_len is one, checked in
  /// make_plan) and each rank keeps its load-balanced slice of input ids and labels (and of the
  /// position / document ids of packed rows).
  data::Batch make_batch(const DatasetRecipe& d, std::vector<data::Sample> samples) const;
  /// The model's device (model.device; cuda: the GPU of this rank's local rank).
  Device device() const;
  /// Data in: the batch's tensors copied to the model's device (the only host -> device copies
  /// of a step besides the first use of each RoPE length).
  data::Batch batch_to_device(data::Batch b) const;
  /// Forward and backward of one micro-batch; returns its loss x label tokens (0 when it holds
  /// none). The objective is the loss weighted n_micro x dp x cp / n_global: FSDP averages
  /// gradients over dp x cp (dp_shard_cp), so their mean is the gradient of the global token mean.
  double micro_batch(const data::Batch& batch, int64_t n_global);
  /// One optimizer step over the next global batch: grad_accum micro-batches (gradient sync on
  /// the last), the strategy's backward completion, clipping, the health check, AdamW, LR step.
  StepResult train_step(TrainingHealth& health);

  // --- validation (trainer_validation.cpp)
  /// Token-mean validation loss over the validation batches (every dp rank its slice).
  double validate();
  /// Validation outside a training step (the step-0 baseline, the end of the run): metrics line
  /// and note on rank 0. Returns the loss, -1 without a full validation batch.
  double validate_and_log(int64_t at_step);
  /// Validation at val_every_steps and at every checkpoint step.
  bool validation_due(bool ckpt_step) const;

  // --- logging (trainer_logging.cpp)
  /// Rank 0: the step's metrics.jsonl line, the progress line, warnings (skipped step, collapse).
  void log_step(const StepResult& s, double val, TrainingHealth& health);

  // --- checkpoints (trainer_checkpoint.cpp)
  /// Automodel's StepScheduler: a checkpoint every ckpt_every_steps and at the last step of each
  /// epoch (save_checkpoint_every_epoch).
  bool checkpoint_due() const;
  /// The sharded checkpoint of this step (parameters, AdamW state, sampler, generator, LR step).
  void save();
  /// Loads the newest checkpoint every rank can read (step, sampler, generator, LR step); a
  /// damaged one (unreadable metadata, a missing or truncated shard) is skipped with a warning,
  /// all ranks alike. Errors (AllRanksError): none of them can be loaded.
  void resume();
  /// A finished job run again: true when there is nothing to do. Its exports are written again
  /// only when missing (killed after the last checkpoint); rank 0 looks, every rank follows.
  bool already_complete();

  // --- the end of the run (trainer.cpp)
  /// After the last step: the final validation and checkpoint when not done at that step, the
  /// exports (adapter, consolidated), the loss plot and the closing line.
  void finish_run();
};

}  // namespace dtr::train::detail
