// dtr-train: fine-tunes a Llama-architecture model from a YAML recipe, on one process or under
// mpirun. Thin front end: CLI parsing here, everything else in apps/train/.
//   dtr-train --config FILE [--set key.path=value ...] [--dry-run [--world-size N]] [--stop-after N] [--no-resume]
//             [--overwrite] [--progress auto|bar|lines]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "apps/train/recipe.h"
#include "apps/train/trainer.h"
#include "runtime/env.h"

int main(int argc, char** argv) {
  CLI::App app{"dtr-train: LoRA / full fine-tuning of Llama models from a YAML recipe (NeMo Automodel keys)"};
  std::string config;
  std::vector<std::string> sets;
  dtr::train::TrainOptions opt;
  app.add_option("-c,--config", config, "recipe YAML file")->required();
  app.add_option("--set", sets, "override a recipe key, e.g. --set optimizer.lr=1e-4 (repeatable)")
      ->allow_extra_args(false);
  app.add_flag("--dry-run", opt.dry_run,
               "print the resolved recipe, mesh, parameter counts, the memory plan per rank and comm per step");
  app.add_option("--world-size", opt.world_size, "with --dry-run: plan for this many ranks from one process")
      ->check(CLI::PositiveNumber);
  app.add_option("--stop-after", opt.stop_after, "leave after this global step without final export (resume tests)");
  app.add_flag("--no-resume", opt.no_resume, "ignore existing checkpoints in checkpoint.checkpoint_dir");
  app.add_flag("--overwrite", opt.overwrite,
               "remove an earlier run's outputs (metrics, plot, adapter, export, checkpoints) that a run from step 0 "
               "would overwrite; without it such a run refuses to start");
  app.add_option("--progress", opt.progress,
                 "progress display: auto (\\r line on a terminal, plain lines under mpirun / srun or in a "
                 "file; default DTR_PROGRESS, else auto), bar, lines")
      ->check(CLI::IsMember({"auto", "bar", "lines"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  int rc = 0;
  try {
    dtr::init(argc, argv);
  } catch (const std::exception& e) {  // the environment is the same on every rank: one line
    if (dtr::rank() == 0) std::fprintf(stderr, "dtr-train: error: %s\n", e.what());
    dtr::finalize();
    return 1;
  }
  dtr::train::Recipe recipe;
  bool ok = true;
  try {
    recipe = dtr::train::load_recipe(config, sets);
    if (!recipe.ignored_keys.empty() && dtr::rank() == 0) {  // one line, whatever the number of keys
      std::string keys;
      for (const auto& k : recipe.ignored_keys) keys += (keys.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "dtr-train: warning: NeMo Automodel keys with no effect on results in dtr, ignored: %s\n",
                   keys.c_str());
    }
  } catch (const std::exception& e) {
    if (dtr::rank() == 0) std::fprintf(stderr, "dtr-train: error: %s\n", e.what());
    ok = false;
    rc = 1;
  }
  if (ok) rc = dtr::train::run_training(recipe, opt);
  dtr::finalize();
  return rc;
}
