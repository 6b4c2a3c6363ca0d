#pragma once
// Hugging Face model directories: config.json + model.safetensors (or sharded with
// model.safetensors.index.json). Import and export of a model checkpoint (any family) as a state dict.
#include <string>

#include "models/formats/hf_config.h"
#include "models/formats/safetensors.h"
#include "models/formats/sharded_checkpoint.h"

namespace dtr {

struct HFCheckpoint {
  ModelConfig config;
  safetensors::TensorMap state_dict;  // HF names, file dtypes
};

/// Loads config.json and every tensor of `dir`. Errors: see load_model_config and
/// safetensors::load_checkpoint; tensors whose shapes disagree with the config (for the
/// standard names of the family) -> dtr::Error naming the tensor, both shapes and the directory.
HFCheckpoint load_hf_checkpoint(const std::string& dir, safetensors::LoadMode mode = safetensors::LoadMode::copy);

/// Writes config.json and the weights (sharded above `max_shard_bytes`) into `dir`; with
/// tie_word_embeddings, lm_head.weight is not written (HF does the same).
/// metadata {"format": "pt"} is set in every shard, as transformers expects.
void save_hf_checkpoint(const HFCheckpoint& ckpt, const std::string& dir,
                        uint64_t max_shard_bytes = safetensors::kDefaultMaxShardBytes);

}  // namespace dtr
