#pragma once
// Model FLOPs of a decoder training step, the formula bench/compare and dtr-bench train-step use
// (bench/compare/torch_llama_lora.py model_flops): per token 6 x the matmul weights that train
// (forward, input gradient, weight gradient), 4 x the frozen ones (forward and input gradient
// only: a LoRA base), plus attention 12 x heads x head_dim x keys summed over the layers (QK^T
// and PV: 4 in forward, 8 in backward), keys = seq (the full square, no causal halving, as PaLM
// and torchtitan count) or, on a sliding-window layer (Mistral, Gemma 3 local layers),
// min(seq, sliding_window). head_dim is the config's (Qwen3, Gemma 3: not hidden / heads).
// Matmul weights: q, k, v, o and the MLP of every layer (gate, up, down: SwiGLU and GeGLU alike)
// and lm_head (hidden x vocab, tied or not); embedding lookups, norms (q/k norms included) and
// soft-capping are not counted.
// Mixture of experts (Qwen3-MoE, Mixtral): a token runs through the router and its top-k experts
// only, so the MLP of a MoE layer counts its *active* weights, hidden x E (router) + k x 3 x
// hidden x moe_intermediate_size (gate, up, down of k experts), not all E experts (the
// "active parameters" of MoE model cards; PaLM / Megatron-LM's MFU convention for MoE).
#include <cstdint>
#include <string>

#include "models/formats/hf_config.h"

namespace dtr {

/// Matmul weights a token uses in `c` (see above): all of them for a dense model, the active ones
/// (router + top-k experts) on MoE layers.
double llama_matmul_weights(const LlamaConfig& c);

/// FLOPs per token of a training step on sequences of `seq` positions. `lora_weights` = the
/// adapter parameters a token uses (all trained; expert adapters counted as active_weights does)
/// when `lora`, else every (active) matmul weight trains.
double llama_train_flops_per_token(const LlamaConfig& c, bool lora, double lora_weights, double seq);

/// The share of parameter `fqn` ([E, ...] grouped expert weights or adapters, under
/// "mlp.experts.") that one token uses: numel x k / E; every other parameter counts in full.
double active_weights(const LlamaConfig& c, const std::string& fqn, int64_t numel);

}  // namespace dtr
