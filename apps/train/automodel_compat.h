#pragma once
// NeMo Automodel recipes (examples/llm_finetune/*.yaml of NVIDIA-NeMo/Automodel) read by
// dtr-train: Automodel's top-level sections and `_target_` keys are rewritten onto dtr's recipe
// tree before it is parsed (recipe.h), so one parser and one set of checks serve both.
//
// Every Automodel key falls in one of three classes (the table in apps/train/README.md):
//   supported   mapped onto a dtr key with the same meaning (e.g. clip_grad_norm.max_norm ->
//               optimizer.max_grad_norm, optimizer._target_: torch.optim.AdamW -> name adamw,
//               dataset._target_: ...make_squad_dataset -> dataset.type squad);
//   ignored     accepted with one warning line, because it cannot change the results (logging
//               services, dist_env.backend, compile on CPU, dataloader workers, ...);
//   rejected    a one-line error naming the key: it would change the results and dtr does not
//               build it (packed sequences, torch.optim.Adam with weight decay, fp8, ...).
// A recipe written for dtr (no Automodel sections or `_target_` keys) passes through unchanged,
// except that mesh sizes given as null / "none" mean "derive" (dp_size: none, ep_size: null).
// Source of the names and defaults: NVIDIA-NeMo/Automodel at 36044ad (2026-08-22):
// nemo_automodel/recipes/_typed_config.py, recipes/llm/train_ft.py,
// components/training/step_scheduler.py, components/optim/optimizer.py + scheduler.py,
// components/checkpoint/config.py, components/datasets/llm/{squad,
// column_mapped_text_instruction_dataset}.py.
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace dtr::train {

/// Rewrites an Automodel-style recipe tree into dtr's sections (a new tree; `root` is not
/// changed). `ignored` receives the dotted names of keys accepted without effect on results.
/// `file` names the recipe in messages.
/// Errors (dtr::Error, one line naming the key): an Automodel key or `_target_` that would
/// change the results and is not built in dtr; a dataset id that is not a local file.
YAML::Node translate_automodel(const YAML::Node& root, const std::string& file, std::vector<std::string>& ignored);

}  // namespace dtr::train
