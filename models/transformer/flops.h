#pragma once
// Model FLOPs of a Llama training step, the formula bench/compare and dtr-bench train-step use
// (bench/compare/torch_llama_lora.py model_flops): per token 6 x the matmul weights that train
// (forward, input gradient, weight gradient), 4 x the frozen ones (forward and input gradient
// only: a LoRA base), plus attention 12 x layers x heads x head_dim x seq (QK^T and PV: 4 in
// forward, 8 in backward). Matmul weights: q, k, v, o, gate, up, down of every layer and
// lm_head (hidden x vocab); embedding lookups and norms are not counted.
#include <cstdint>

#include "models/formats/hf_config.h"

namespace dtr {

/// Matmul weights of `c` (see above).
double llama_matmul_weights(const LlamaConfig& c);

/// FLOPs per token of a training step on sequences of `seq` positions. `lora_weights` = the
/// adapter parameters (all trained) when `lora`, else every matmul weight trains.
double llama_train_flops_per_token(const LlamaConfig& c, bool lora, double lora_weights, double seq);

}  // namespace dtr
