#pragma once
// Decoder tensors in GGUF <-> Hugging Face state-dict names, per family (the table of
// ModelFamily::gguf_layer_names), and loading a GGUF model as an HF state dict (dequantised to
// f32, llama.cpp's Q/K row permutation undone for the families it permutes, its norm shift
// (Gemma: + 1) taken off). The Llama table:
//   token_embd.weight        <-> model.embed_tokens.weight
//   blk.N.attn_norm.weight   <-> model.layers.N.input_layernorm.weight
//   blk.N.attn_{q,k,v}.weight<-> model.layers.N.self_attn.{q,k,v}_proj.weight (q, k permuted)
//   blk.N.attn_output.weight <-> model.layers.N.self_attn.o_proj.weight
//   blk.N.ffn_norm.weight    <-> model.layers.N.post_attention_layernorm.weight
//   blk.N.ffn_{gate,up,down}.weight <-> model.layers.N.mlp.{gate,up,down}_proj.weight
//   output_norm.weight       <-> model.norm.weight
//   output.weight            <-> lm_head.weight (absent when embeddings are tied)
// (and the .bias variants of the attention projections); Qwen3 adds attn_{q,k}_norm; Gemma 3 has
// post_attention_norm, ffn_norm = pre_feedforward_layernorm, post_ffw_norm (models/families/).
// Qwen3-MoE's MoE layers (llama.cpp's qwen3moe; 3-D tensors, ne = [H, I, E] = numpy / HF
// [E, I, H], so the bytes are HF's row-major order):
//   blk.N.ffn_gate_inp.weight   [E, H]     <-> model.layers.N.mlp.gate.weight (router)
//   blk.N.ffn_gate_exps.weight  [E, I, H]  + blk.N.ffn_up_exps.weight [E, I, H]
//                               <-> model.layers.N.mlp.experts.gate_up_proj [E, 2I, H]
//   blk.N.ffn_down_exps.weight  [E, H, I]  <-> model.layers.N.mlp.experts.down_proj
// (gate rows then up rows of each expert: transformers' Qwen2MoeTensorProcessor joins them so).
// Source: llama.cpp gguf-py/gguf/tensor_mapping.py and convert_hf_to_gguf.py.
#include <set>
#include <string>
#include <vector>

#include "models/formats/gguf.h"
#include "models/formats/hf_config.h"
#include "models/formats/safetensors.h"

namespace dtr {

/// HF name of a GGUF tensor name in `model_type`'s table, or "" when it is not a model weight
/// (e.g. rope_freqs).
std::string gguf_to_hf_name(const std::string& gguf_name, const std::string& model_type = "llama");
/// GGUF name of an HF tensor name (of a joined tensor: its first part), or "".
std::string hf_to_gguf_name(const std::string& hf_name, const std::string& model_type = "llama");
/// The GGUF tensors an HF tensor is made of, in order: one, or the parts of a joined tensor
/// (mlp.experts.gate_up_proj: ffn_gate_exps, ffn_up_exps); {} when it has no GGUF name.
std::vector<std::string> hf_to_gguf_names(const std::string& hf_name, const std::string& model_type = "llama");

/// Where a GGUF tensor goes: HF tensor `hf` ("" when not a weight), slice `part` of `parts`
/// equal slices along the HF tensor's second-to-last dim.
struct GGUFPart {
  std::string hf;
  int part = 0;
  int parts = 1;
};
GGUFPart gguf_part(const std::string& gguf_name, const std::string& model_type = "llama");
/// Shape of one of `parts` slices of an HF tensor of shape `hf_shape` (second-to-last dim / parts).
Shape gguf_part_shape(const Shape& hf_shape, int parts);

/// The HF weights of GGUF `g` under config `c`, after checking that each GGUF tensor of the
/// family has its shape under `c` (expected_shape, per part) and that every required weight
/// (required_tensor_names: each of its GGUF parts) is there. Errors: dtr::Error naming the
/// file, the GGUF tensor, its HF name and part, and the shape expected (for expert tensors also
/// the <arch>.expert_count / expert_feed_forward_length it follows from).
std::set<std::string> check_gguf_tensors(const gguf::GGUFFile& g, const ModelConfig& c);

/// Which head count the permutation of an HF tensor uses: num_attention_heads for q_proj,
/// num_key_value_heads for k_proj, 0 for every other tensor and for families llama.cpp does not
/// permute.
int64_t qk_permute_heads(const std::string& hf_name, const ModelConfig& c);

/// The value llama.cpp adds to the HF tensor `hf_name` of family `c` (Gemma's norms: 1), else 0.
double gguf_value_shift(const std::string& hf_name, const ModelConfig& c);

/// Every HF tensor name a model of config `c` has (lm_head.weight only when untied), in model
/// order; MoE layers (ModelConfig::is_moe_layer) have mlp.gate.weight, mlp.experts.gate_up_proj
/// and mlp.experts.down_proj instead of the dense MLP.
std::vector<std::string> required_tensor_names(const ModelConfig& c);

/// Every model tensor of a GGUF file as HF-named CPU f32 tensors in HF row order and values
/// (joined tensors concatenated from their parts). Shapes are checked against `c`
/// (check_gguf_tensors; e.g. q_proj [heads*head_dim, hidden]).
/// Errors: a missing tensor, a shape that disagrees with the config -> dtr::Error naming the
/// GGUF and HF names, the shapes and the file. Tensors that are not weights of the family (e.g.
/// rope_freqs.weight) are skipped.
safetensors::TensorMap load_gguf_state_dict(const gguf::GGUFFile& g, const ModelConfig& c);

/// The HF shape every model weight must have under `c` ({} for names that are not weights).
Shape expected_shape(const std::string& hf_name, const ModelConfig& c);

}  // namespace dtr
