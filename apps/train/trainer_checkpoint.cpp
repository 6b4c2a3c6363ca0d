// dtr-train's checkpoint hooks: when a checkpoint is due, saving one, resuming from the newest
// loadable one, and a finished run started again.
#include <cstdio>
#include <filesystem>

#include "apps/train/checkpoint.h"
#include "apps/train/trainer_impl.h"
#include "tensor/random.h"

namespace fs = std::filesystem;

namespace dtr::train::detail {

bool Trainer::checkpoint_due() const {
  const auto& st = r.step_scheduler;
  const bool epoch_end = step % sampler->batches_per_epoch() == 0;
  return r.checkpoint.enabled && ((st.ckpt_every_steps > 0 && step % st.ckpt_every_steps == 0) ||
                                  (st.save_checkpoint_every_epoch && epoch_end && step < total_steps));
}

void Trainer::save() {
  nlohmann::json extra;
  extra["step"] = step;
  extra["sampler"] = sampler->state_dict();
  const auto g = generator_state();
  extra["rng"] = {{"seed", g.seed}, {"offset", g.offset}};
  extra["lr_step"] = sched->last_step();
  extra["mesh"] = ctx().str();
  extra["recipe"] = dump_recipe(r);
  save_checkpoint(r.checkpoint.checkpoint_dir, step, params, *optimizer, extra, r.checkpoint.keep_last,
                  *world_mesh->group(0));
  note("checkpoint " + r.checkpoint.checkpoint_dir + "/step_" + std::to_string(step));
  last_saved = step;
}

void Trainer::resume() {
  if (!r.checkpoint.enabled || opt.no_resume) return;
  const std::vector<std::string> dirs = checkpoints_newest_first(r.checkpoint.checkpoint_dir);
  std::string first_problem;
  for (const auto& dir : dirs) {
    const std::string why = checkpoint_problem(dir);
    if (all_ranks_max(why.empty() ? 0 : 1) != 0) {
      const std::string w = why.empty() ? "damaged on another rank" : why;
      if (first_problem.empty()) first_problem = dir + ": " + w;
      if (rank == 0)
        std::fprintf(stderr, "dtr-train: warning: checkpoint %s is damaged (%s); trying the previous one\n",
                     dir.c_str(), w.c_str());
      continue;
    }
    nlohmann::json extra = load_checkpoint(dir, params, *optimizer);
    step = extra["step"].get<int64_t>();
    sampler->load_state_dict(extra["sampler"]);
    set_generator_state({extra["rng"]["seed"].get<uint64_t>(), extra["rng"]["offset"].get<uint64_t>()});
    sched->set_step(extra["lr_step"].get<int64_t>());
    note("resumed from " + dir + " (step " + std::to_string(step) + ")");
    first_problem.clear();
    break;
  }
  if (!first_problem.empty())
    throw AllRanksError("no checkpoint under " + r.checkpoint.checkpoint_dir + " can be loaded (newest: " +
                        first_problem + "); repair or remove them, or start over with --no-resume --overwrite");
}

bool Trainer::already_complete() {
  if (step < total_steps || step == 0) return false;
  bool missing = false;
  if (rank == 0) {
    std::error_code ec;
    missing = (r.peft.enabled && !fs::exists(fs::path(r.checkpoint.adapter_dir) / "adapter_config.json", ec)) ||
              (r.checkpoint.save_consolidated &&
               !fs::exists(fs::path(r.checkpoint.checkpoint_dir) / "consolidated" / "config.json", ec));
  }
  missing = all_ranks_max(missing ? 1 : 0) != 0;
  if (!missing) {
    note("nothing to do: the run is complete (step " + std::to_string(step) + " of " + std::to_string(total_steps) +
         " in " + r.checkpoint.checkpoint_dir + "); its outputs are left as they are. Raise "
         "step_scheduler.max_steps / num_epochs to train further, or --no-resume --overwrite to start over");
    return true;
  }
  note("the run is complete (step " + std::to_string(step) + " of " + std::to_string(total_steps) +
       "); writing its missing exports");
  return false;
}
}  // namespace dtr::train::detail
