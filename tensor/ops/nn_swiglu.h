#pragma once
// The joined form of swiglu (ops.h has swiglu(gate, up)), kept out of ops.h as only the MoE
// experts use it, and geglu (only the gated MLP uses it).
#include "tensor/tensor.h"

namespace dtr {

/// swiglu of the two halves of the last dim of `gate_up` [..., 2I] (gate first, then up) ->
/// [..., I]: the MoE experts' joined gate_up projection (Megatron-LM's SwiGLU on chunk(x, 2, -1)).
/// Its gradient is formed as one [..., 2I] tensor by one op (swiglu_joined_backward), not as
/// two zero-filled narrow gradients summed. Errors: an odd or empty last dim, a non-floating dtype.
Tensor swiglu(const Tensor& gate_up);

/// weights[r] * swiglu(gate_up[r]): gate_up [..., 2I] as above, weights [...] (its leading dims,
/// same dtype) -> [..., I]. The MoE experts' hidden rows scaled by their routing weight before
/// the down projection, so that the combine is a plain sum of each token's k rows (Megatron-LM's
/// weighted_bias_swiglu, torchtitan's fused_silu_gate_prob). Backward is one op,
/// "swiglu_weighted_backward" {g, gate_up, weights} -> {d gate_up, d weights}:
/// d gate_up = the swiglu gradient of weights[r] * g[r], d weights[r] = <g[r], swiglu(gate_up[r])>.
/// Errors: an odd or empty last dim, weights of another shape or dtype, a non-floating dtype.
Tensor swiglu_weighted(const Tensor& gate_up, const Tensor& weights);

/// swiglu_weighted(grouped_mm(x, w, group_sizes), weights) with the SwiGLU of each row block
/// computed right after its GEMM, while the block is in the cache (the experts' gate_up
/// projection; x [T, K], w [G, K, 2I] (e.g. gate_up_proj.transpose(1, 2)), weights [T] -> [T, I]).
/// The values and the autograd graph are those of the two calls (a grouped_mm node, then a
/// swiglu_weighted node: the same backward, the same bits; bf16 / f16 inputs run the two ops).
/// Errors: those of the two calls.
Tensor grouped_mm_swiglu(const Tensor& x, const Tensor& w, const Shape& group_sizes, const Tensor& weights);

/// gelu(gate, approximate=tanh) * up, fused (Gemma's GeGLU MLP, HF gelu_pytorch_tanh): gate,
/// up same shape, same floating dtype (no broadcasting). Computed as gate * sigmoid(2u),
/// u = sqrt(2/pi) (gate + 0.044715 gate^3) (equal to 0.5 gate (1 + tanh(u))). Backward is one
/// fused op: dup = g * gelu(gate), dgate = g * up * gelu'(gate). Errors: shape or dtype
/// mismatch, non-floating dtype. Source: Shazeer 2020 "GLU Variants Improve Transformer";
/// PyTorch F.gelu(approximate='tanh'); Hendrycks & Gimpel 2016.
Tensor geglu(const Tensor& gate, const Tensor& up);

}  // namespace dtr
