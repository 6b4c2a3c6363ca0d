#pragma once
// Token permutation of a mixture-of-experts block (kept out of ops.h: only nn::MoE uses it).
// The N tokens' top-k copies are sorted by expert: slot s = t * k + j (token t, its j-th expert)
// sits at sorted position slot_position[s], and sorted_token[p] is the token of position p
// (slot_position is a permutation of [0, N*k); sorted_token[slot_position[t*k+j]] == t).
// Source: Megatron-LM / Transformer Engine moe_permute and moe_unpermute (probs applied in the
// unpermute), transformers' grouped_mm experts (hidden_states[perm // top_k], index_add).
#include "tensor/tensor.h"

namespace dtr {

/// x [N, H] -> [N*k, H], row p = x[sorted_token[p]] (a row gather). Backward gathers instead of
/// scattering: dx[t] = sum_j g[slot_position[t*k + j]] (j increasing), no zero fill, no atomics.
/// sorted_token, slot_position: int64 CPU [N*k]. Errors: shapes, an index out of range.
Tensor moe_permute(const Tensor& x, const Tensor& sorted_token, const Tensor& slot_position, int64_t k);

/// ys [N*k, H] (expert outputs in sorted order), probs [N, k] -> out [N, H]:
///   out[t] = sum_j probs[t, j] * ys[slot_position[t*k + j]]   (j increasing).
/// Backward: dys[slot_position[t*k+j]] = probs[t, j] * g[t], dprobs[t, j] = <g[t], ys[...]>.
/// Replaces gather + broadcast mul + sum over k (and their backwards). Errors: shapes (k >= 1), dtypes,
/// an index out of range.
Tensor moe_unpermute(const Tensor& ys, const Tensor& slot_position, const Tensor& probs);

}  // namespace dtr
