#pragma once
// Final exports of dtr-train: the PEFT adapter (checkpoint.adapter_dir) and, with
// checkpoint.save_consolidated, the merged Hugging Face model (<checkpoint_dir>/consolidated).
//
// Collective over the world: every rank gathers the full tensor of each distributed parameter
// the exports need, in one order fixed before anything changes (the module's
// named_parameters, the same on every rank), so the gathers match on any mesh (dp, tp,
// dp x tp). Only rank 0 keeps them: it puts them into its module as plain tensors and writes
// the files (the merged weights are then the single-process merge W + scale B A).
#include <string>
#include <vector>

#include "apps/train/recipe.h"
#include "models/transformer/causal_lm.h"

namespace dtr::train {

/// Writes the exports the recipe asks for; returns the lines to report (rank 0: one per
/// directory written; others: empty). After it, rank 0's module holds plain full tensors.
std::vector<std::string> export_final(LlamaForCausalLM& model, const Recipe& r);

/// What the PEFT adapter's base_model_name_or_path says, something PEFT resolves
/// (AutoPeftModelForCausalLM.from_pretrained(adapter)): checkpoint.base_model_name_or_path when
/// given (e.g. a hub id); an HF model.path as an absolute path; a GGUF model.path exported once
/// as HF to <checkpoint_dir>/base_model (PEFT cannot read GGUF; the GGUF path is kept in the
/// adapter's dtr_adapter.json); "" for a random model. Appends a line when it exports.
std::string peft_base_model(const Recipe& r, std::vector<std::string>& lines);

}  // namespace dtr::train
