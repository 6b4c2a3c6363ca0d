#pragma once
// Loading a CausalLM without reading it: the module tree is built on meta tensors
// (tensor/meta.h) and every parameter's recipe becomes a reader of its range of the file, so that
// parallelize_model later reads on each rank only the bytes of its own rows / columns:
//  - safetensors (one file or a sharded checkpoint with its index): the byte ranges of the block,
//    straight from the memory map, converted to the model dtype;
//  - GGUF: only the quantisation blocks covering the block's rows and columns, dequantised on
//    the fly, with llama.cpp's Q/K row permutation undone row by row and its norm shift removed;
//    MoE experts too (3-d [E, rows, cols]; gate_up_proj's rows from ffn_gate_exps / ffn_up_exps).
// The values equal load_model's (load.h) bit for bit. Pages read are dropped from the process's
// map afterwards (release_mapped_range), so the file does not stay in the rank's RSS.
// Source: PyTorch meta-device init; safetensors' safe_open(...).get_slice; llama.cpp's block layout.
#include <memory>
#include <string>

#include "models/transformer/causal_lm.h"

namespace dtr {

/// The model of `path` (GGUF file or HF directory / index / .safetensors) on meta tensors whose
/// recipes read the file. Checks as load_model: every model key present (lm_head.weight may be
/// absent when tied), no unexpected key (rotary_emb.inv_freq ignored), shapes equal. MoE HF
/// checkpoints storing experts one by one (Qwen3-MoE mlp.experts.N.{gate,up,down}_proj, Mixtral
/// block_sparse_moe.experts.N.w1/w3/w2) give the grouped [E, ...] parameters (moe.cpp's
/// group_expert_weights layout) whose blocks read only their experts' byte ranges.
/// Errors: dtr::Error naming the file and the keys at fault.
std::shared_ptr<CausalLM> load_model_meta(const std::string& path, DType dtype = DType::f32);

}  // namespace dtr
