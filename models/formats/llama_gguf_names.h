#pragma once
// Llama tensors in GGUF <-> Hugging Face state-dict names, and loading a GGUF Llama as an HF
// state dict (dequantised to f32, llama.cpp's Q/K row permutation undone).
//   token_embd.weight        <-> model.embed_tokens.weight
//   blk.N.attn_norm.weight   <-> model.layers.N.input_layernorm.weight
//   blk.N.attn_{q,k,v}.weight<-> model.layers.N.self_attn.{q,k,v}_proj.weight (q, k permuted)
//   blk.N.attn_output.weight <-> model.layers.N.self_attn.o_proj.weight
//   blk.N.ffn_norm.weight    <-> model.layers.N.post_attention_layernorm.weight
//   blk.N.ffn_{gate,up,down}.weight <-> model.layers.N.mlp.{gate,up,down}_proj.weight
//   output_norm.weight       <-> model.norm.weight
//   output.weight            <-> lm_head.weight (absent when embeddings are tied)
// (and the .bias variants of the attention projections). Source: llama.cpp
// gguf-py/gguf/tensor_mapping.py and convert_hf_to_gguf.py (LlamaModel.modify_tensors).
#include <string>

#include "models/formats/gguf.h"
#include "models/formats/hf_config.h"
#include "models/formats/safetensors.h"

namespace dtr {

/// HF name of a GGUF tensor name, or "" when it is not a Llama tensor (e.g. rope_freqs).
std::string gguf_to_hf_name(const std::string& gguf_name);
/// GGUF name of an HF tensor name, or "".
std::string hf_to_gguf_name(const std::string& hf_name);

/// Which head count the permutation of an HF tensor uses: num_attention_heads for q_proj,
/// num_key_value_heads for k_proj, 0 for every other tensor.
int64_t qk_permute_heads(const std::string& hf_name, const LlamaConfig& c);

/// Every Llama tensor of a GGUF file as HF-named CPU f32 tensors in HF row order.
/// Shapes are checked against `c` (e.g. q_proj [heads*head_dim, hidden]).
/// Errors: a missing tensor, a shape that disagrees with the config -> dtr::Error naming the
/// GGUF and HF names, the shapes and the file. Tensors that are not Llama weights (e.g.
/// rope_freqs.weight) are skipped.
safetensors::TensorMap load_gguf_llama_state_dict(const gguf::GGUFFile& g, const LlamaConfig& c);

/// The HF shape every Llama weight must have under `c` ("" names give {}).
Shape expected_llama_shape(const std::string& hf_name, const LlamaConfig& c);

}  // namespace dtr
