#pragma once
// Loading a LlamaForCausalLM from a GGUF file or a Hugging Face directory, and exporting it
// as a Hugging Face directory (config.json + model.safetensors, sharded above a size).
// Names: Hugging Face's (see llama.h); the GGUF name map and the undoing of llama.cpp's Q/K
// row permutation live in models/formats/llama_gguf_names.h.
#include <memory>
#include <string>

#include "models/formats/safetensors.h"
#include "models/formats/sharded_checkpoint.h"
#include "models/llama/llama.h"

namespace dtr {

/// From a GGUF file: config from its metadata (llama_config_from_gguf), every weight
/// dequantised to f32 and Q/K rows put back in HF order, then converted to `dtype`.
/// Tied embeddings when the file has no output.weight.
/// Errors: dtr::Error naming the file and the key at fault (missing metadata or tensor, a
/// shape that disagrees with the config, an unsupported quantisation type).
std::shared_ptr<LlamaForCausalLM> load_llama_gguf(const std::string& path, DType dtype = DType::f32);

/// From a Hugging Face directory: config.json + model.safetensors or the sharded
/// model.safetensors.index.json. lm_head.weight may be absent when tied (HF omits it);
/// rotary_emb.inv_freq buffers of old checkpoints are ignored.
/// Errors: dtr::Error naming the directory and the keys that are missing / unexpected or
/// whose shapes disagree.
std::shared_ptr<LlamaForCausalLM> load_llama_hf(const std::string& dir, DType dtype = DType::f32);

/// load_llama_gguf for a path ending in ".gguf", load_llama_hf otherwise.
std::shared_ptr<LlamaForCausalLM> load_llama(const std::string& path, DType dtype = DType::f32);

/// Copies an HF-named state dict into `model` (strict: every model key, nothing else;
/// lm_head.weight may be absent when tied). `source` names the file in messages.
void load_llama_state_dict(LlamaForCausalLM& model, safetensors::TensorMap sd, const std::string& source);

/// The HF state dict of `model` for export: base weights under HF names, with the update of
/// every (unmerged) LoRALinear merged in (W + scale * B A) and no lora_A / lora_B keys;
/// lm_head.weight left out when tied. Tensors are detached; the model is unchanged.
safetensors::TensorMap llama_export_state_dict(LlamaForCausalLM& model);

/// Writes config.json and llama_export_state_dict(model) into `dir` (created if needed):
/// model.safetensors, or shards + index above `max_shard_bytes`. Metadata {"format": "pt"}.
void save_llama_hf(LlamaForCausalLM& model, const std::string& dir,
                   uint64_t max_shard_bytes = safetensors::kDefaultMaxShardBytes);

}  // namespace dtr
