#pragma once
// Loading a CausalLM of any family from a GGUF file or a Hugging Face directory, and exporting
// it as a Hugging Face directory (config.json + model.safetensors, sharded above a size).
// Names: Hugging Face's (see causal_lm.h); the GGUF name maps, the undoing of llama.cpp's Q/K
// row permutation and of its norm shift live in models/transformer/gguf_names.h.
#include <memory>
#include <string>

#include "models/formats/safetensors.h"
#include "models/formats/sharded_checkpoint.h"
#include "models/transformer/causal_lm.h"

namespace dtr {

/// From a GGUF file: config from its metadata (model_config_from_gguf), every weight
/// dequantised to f32 and put back in HF order and values, then converted to `dtype`.
/// Tied embeddings when the file has no output.weight.
/// Errors: dtr::Error naming the file and the key at fault (missing metadata or tensor, a
/// shape that disagrees with the config, an unsupported quantisation type or architecture).
std::shared_ptr<CausalLM> load_model_gguf(const std::string& path, DType dtype = DType::f32);

/// From a Hugging Face directory: config.json + model.safetensors or the sharded
/// model.safetensors.index.json. lm_head.weight may be absent when tied (HF omits it);
/// rotary_emb.inv_freq buffers of old checkpoints are ignored.
/// Errors: dtr::Error naming the directory and the keys that are missing / unexpected or
/// whose shapes disagree.
std::shared_ptr<CausalLM> load_model_hf(const std::string& dir, DType dtype = DType::f32);

/// load_model_gguf for a path ending in ".gguf", load_model_hf otherwise.
std::shared_ptr<CausalLM> load_model(const std::string& path, DType dtype = DType::f32);

/// HF checkpoints of MoE families store experts one by one: Qwen3-MoE
/// `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`, Mixtral
/// `model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight` (+ `block_sparse_moe.gate.weight`);
/// dtr holds them grouped as transformers 5 does in memory (`mlp.experts.gate_up_proj` [E, 2I, H]
/// = gate rows then up rows of each expert, `mlp.experts.down_proj` [E, H, I], `mlp.gate.weight`).
/// Rewrites `sd` in place for every MoE layer of `c` (already grouped keys are kept). Errors: an
/// expert missing from a layer (names the key).
void group_expert_weights(const ModelConfig& c, safetensors::TensorMap& sd);

/// Copies an HF-named state dict into `model` (strict: every model key, nothing else;
/// lm_head.weight may be absent when tied). `source` names the file in messages.
void load_model_state_dict(CausalLM& model, safetensors::TensorMap sd, const std::string& source);

/// The HF state dict of `model` for export: base weights under HF names, with the update of
/// every (unmerged) LoRALinear and of LoRA on MoE experts (per expert) merged in (W + scale * B A)
/// and no adapter keys;
/// lm_head.weight left out when tied. Tensors are detached; the model is unchanged.
safetensors::TensorMap model_export_state_dict(CausalLM& model);

/// Writes config.json and model_export_state_dict(model) into `dir` (created if needed):
/// model.safetensors, or shards + index above `max_shard_bytes`. Metadata {"format": "pt"}.
void save_model_hf(CausalLM& model, const std::string& dir,
                   uint64_t max_shard_bytes = safetensors::kDefaultMaxShardBytes);

}  // namespace dtr
