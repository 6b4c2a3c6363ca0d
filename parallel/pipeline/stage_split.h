#pragma once
// How the repeated layers of a model are divided over pipeline stages. Stage s of S holds
// layers [begin(s), end(s)); the first stage also holds the input embedding, the last the final
// norm, the output projection and the loss (the model side builds the stage modules:
// models/transformer/pipeline_stage.h).
// Source: torchtitan / Automodel pipeline_module_split (generate_hf_model_fqn_per_model_part:
// num_layers / stages each, the first num_layers % stages stages one more).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtr {

/// Layer counts of `num_stages` stages over `num_layers` layers: `counts` when given (a recipe
/// list; it must have num_stages entries, each >= 1, summing to num_layers), otherwise balanced
/// by layer count (num_layers / num_stages each, the first num_layers % num_stages stages one
/// more). Errors (naming `where`): fewer layers than stages, a list of the wrong length / sum or
/// with an entry < 1.
std::vector<int64_t> split_layers(int64_t num_layers, int num_stages, const std::vector<int64_t>& counts,
                                  const std::string& where);

/// [begin, end) layer ranges of the stages for the counts of split_layers.
std::vector<std::pair<int64_t, int64_t>> stage_layer_ranges(const std::vector<int64_t>& counts);

}  // namespace dtr
