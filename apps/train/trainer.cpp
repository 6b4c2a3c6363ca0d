// dtr-train on one rank: run_training (plan, data, output directory, error reporting) and the
// job's flow, Trainer::run. The steps it calls live beside it (trainer_impl.h lists them).
#include "apps/train/trainer.h"

#include <cmath>
#include <cstdio>

#include "apps/train/export.h"
#include "apps/train/outputs.h"
#include "apps/train/trainer_impl.h"
#include "tensor/error.h"

namespace dtr::train::detail {

void Trainer::finish_run() {
  if (has_val() && last_val_step != step && step > first_step) {
    const double val = validate_and_log(step);
    if (val >= 0) last_val = val;  // -1: no full validation batch (fewer samples than local x dp)
  }
  if (r.checkpoint.enabled && last_saved != step) save();
  if (pipe && (r.peft.enabled || r.checkpoint.save_consolidated)) pipe->gather_to_first_stage_rank();
  for (const auto& line : export_final(*model, r)) note(line);
  if (rank == 0) {
    if (plot_loss_png(r.logging.metrics_file, r.logging.plot_file)) note("loss curve: " + r.logging.plot_file);
    const std::string loss_txt =
        std::isnan(last_loss) ? "no training step in this run" : strformat("train loss %.4f", last_loss);
    note(strformat("done: %lld steps, %s%s, metrics %s", (long long)step, loss_txt.c_str(),
                   std::isnan(last_val) ? "" : strformat(", validation loss %.4f", last_val).c_str(),
                   r.logging.metrics_file.c_str()));
  }
}

int Trainer::run() {
  progress = std::make_unique<ProgressPrinter>(stdout, opt.progress);
  setup_model();
  setup_optimizer();
  resume();
  sched->set_step(step);
  if (already_complete()) {
    world_mesh->group(0)->barrier()->wait();
    return 0;
  }
  setup_metrics();
  first_step = last_saved = step;
  if (has_val() && step == 0) validate_and_log(0);  // the baseline the validation curve starts from
  TrainingHealth health(r.step_scheduler.on_nonfinite);
  t_loop = Clock::now();  // ETA: wall time per step so far, validation and checkpoints included
  model->train();
  while (step < total_steps) {
    const StepResult s = train_step(health);
    const bool ckpt_step = checkpoint_due();
    const double val = validation_due(ckpt_step) ? validate() : -1;
    log_step(s, val, health);
    if (val >= 0) {
      last_val = val;
      last_val_step = step;
    }
    if (ckpt_step) save();
    if (opt.stop_after > 0 && step >= opt.stop_after && step < total_steps) {
      if (rank == 0) progress->finish();
      note("stopping after step " + std::to_string(step) + " (--stop-after)");
      return 0;
    }
  }
  if (rank == 0) progress->finish();
  finish_run();
  world_mesh->group(0)->barrier()->wait();
  return 0;
}

}  // namespace dtr::train::detail

namespace dtr::train {

int run_training(const Recipe& r, const TrainOptions& opt) {
  const int rank = dtr::rank(), world = dtr::world_size();
  Plan plan;
  std::vector<data::Sample> train_set, val_set;
  int32_t pad_id = 0;
  try {
    DTR_CHECK(opt.world_size == 0 || opt.dry_run, "--world-size plans without running: use it with --dry-run");
    plan = make_plan(r, opt.world_size > 0 ? opt.world_size : world);
    if (opt.dry_run) {
      if (rank == 0) std::printf("%s", dry_run_report(r, plan).c_str());
      return 0;
    }
    train_set = load_samples(r, r.dataset, "dataset", &pad_id);
    if (r.validation_dataset.enabled) val_set = load_samples(r, r.validation_dataset, "validation_dataset");
    DTR_CHECK(static_cast<int64_t>(train_set.size()) >= r.step_scheduler.global_batch_size, "dataset: ",
              train_set.size(), " samples are fewer than step_scheduler.global_batch_size=",
              r.step_scheduler.global_batch_size, " (", r.dataset.paths.front(), ")");
    int64_t max_id = 0;
    for (const auto& s : train_set)
      for (int32_t t : s.input_ids) max_id = std::max<int64_t>(max_id, t);
    DTR_CHECK(max_id < plan.config.vocab_size, "dataset: token id ", max_id, " >= the model's vocab_size=",
              plan.config.vocab_size, " (", plan.model_source, "; dataset.tokenizer does not match the model)");
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "dtr-train: error: %s\n", e.what());
    return 1;
  }
  // The output directory: locked by rank 0 for the run, earlier outputs never overwritten
  // silently. Rank 0 decides, every rank learns the outcome (a bounded world all-reduce).
  std::unique_ptr<OutputLock> lock;
  {
    std::string err;
    std::vector<std::string> notes;
    if (rank == 0) {
      try {
        notes = prepare_outputs(r, !opt.no_resume, opt.overwrite, lock);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    if (all_ranks_max(err.empty() ? 0 : 1) != 0) {
      if (rank == 0) std::fprintf(stderr, "dtr-train: error: %s\n", err.c_str());
      return 1;
    }
    for (const auto& n : notes) std::printf("%s\n", n.c_str());
  }
  try {
    detail::Trainer t(r, opt, plan, train_set, val_set, pad_id, rank, world);
    return t.run();
  } catch (const AllRanksError& e) {  // every rank is here with the same message
    if (rank == 0) std::fprintf(stderr, "dtr-train: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] dtr-train: error: %s\n", rank, e.what());
    std::fflush(stderr);
    if (world > 1) abort_job("dtr-train failed");
    return 1;
  }
}

}  // namespace dtr::train
