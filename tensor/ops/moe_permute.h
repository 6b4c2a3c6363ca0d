#pragma once
// Token permutation of a mixture-of-experts block (kept out of ops.h: only nn::MoE uses it).
// The N tokens' top-k copies are sorted by expert: slot s = t * k + j (token t, its j-th expert)
// sits at sorted position slot_position[s] (a permutation of [0, N*k)).
// Source: Megatron-LM / Transformer Engine moe_permute and moe_unpermute (probs applied in the
// unpermute, or none), transformers' grouped_mm experts (hidden_states[perm // top_k], index_add).
#include "tensor/tensor.h"

namespace dtr {

/// x [N, H] -> [N*k, H], row slot_position[t*k + j] = x[t] (each token's k copies; token-major,
/// so each row of x is read once). Backward: dx[t] = sum_j g[slot_position[t*k + j]] (j
/// increasing), no zero fill, no atomics. slot_position: int64 CPU [N*k], a permutation.
/// Errors: shapes, an index out of range or repeated.
Tensor moe_permute(const Tensor& x, const Tensor& slot_position, int64_t k);

/// ys [N*k, H] (expert outputs in sorted order), probs [N, k] -> out [N, H]:
///   out[t] = sum_j probs[t, j] * ys[slot_position[t*k + j]]   (j increasing).
/// Backward: dys[slot_position[t*k+j]] = probs[t, j] * g[t], dprobs[t, j] = <g[t], ys[...]>.
/// Replaces gather + broadcast mul + sum over k (and their backwards). Errors: shapes (k >= 1), dtypes,
/// an index out of range.
Tensor moe_unpermute(const Tensor& ys, const Tensor& slot_position, const Tensor& probs);

/// The transpose of moe_permute, without weights (Megatron's moe_unpermute with probs=None: the
/// routing weights already applied to the expert rows, swiglu_weighted):
/// ys [N*k, H] -> out [N, H], out[t] = sum_j ys[slot_position[t*k + j]] (j increasing; the kernel
/// of moe_permute's backward). Backward is moe_permute's kernel: dys[slot_position[t*k + j]] = g[t].
/// Errors: shapes (rows a multiple of k), an index out of range or repeated.
Tensor moe_unpermute(const Tensor& ys, const Tensor& slot_position, int64_t k);

}  // namespace dtr
