#pragma once
// Context parallelism: every rank of a `cp` group holds a slice of every sequence, and causal
// attention stays exact across the slices.
//   Layout (load balancing for causal attention): a sequence of T tokens is cut into 2 * cp
//     chunks of c = T / (2 cp); rank r holds chunks r and 2cp - 1 - r, in that order (its local
//     sequence is 2c tokens). Early chunks see few keys and late ones many, so each rank gets the
//     same attention work. Source: torchtitan / PyTorch context_parallel (_HeadTailLoadBalancer),
//     Llama 3 paper (Dubey et al. 2024, section 3.3.2).
//   Attention: keys and values are all-gathered over cp (the backward reduce-scatters their
//     gradients), put back in sequence order, and each local query chunk attends to the prefix of
//     keys up to its own end with the ordinary bottom-right causal sdpa: chunk i's queries sit at
//     global positions [i c, (i + 1) c), the prefix holds keys [0, (i + 1) c), so bottom-right
//     alignment is exactly the global-position causal mask (and a sliding window counts back from
//     the global position). Llama 3's choice: exact, simple, differentiable, and with GQA the
//     gathered K/V are Hkv / Hq of the query size. Ring attention (K/V blocks passed with
//     send/recv, overlapped with compute) is not built.
// RoPE positions are global positions (context_parallel_positions).
#include <memory>
#include <optional>
#include <vector>

#include "runtime/device_mesh.h"
#include "tensor/nn/module.h"
#include "tensor/tensor.h"

namespace dtr {

/// This rank's slice of `x` along `dim` (length T): chunks `cp_rank` and 2 cp - 1 - cp_rank of
/// 2 cp equal chunks, concatenated -> length T / cp. A view-free copy (differentiable: the gradient
/// goes back to those rows, zeros elsewhere). cp_size 1 returns x.
/// Errors (one line, shapes and numbers): T % (2 cp_size) != 0, cp_rank outside [0, cp_size).
Tensor context_parallel_shard(const Tensor& x, int64_t dim, int64_t cp_size, int64_t cp_rank);

/// The inverse over the cp group `pg`: every rank's slice along `dim` (length 2c) gathered and
/// put back in sequence order -> length 2c * cp. Differentiable (all_gather forward,
/// reduce-scatter backward: the full gradient is summed over the ranks and each keeps its
/// slice's rows). Collective: every rank of `pg` calls it with the same shapes.
Tensor context_parallel_unshard(const Tensor& local, int64_t dim, const std::shared_ptr<ProcessGroup>& pg);

/// Global positions of the local_len tokens of rank cp_rank's slice (load-balanced layout):
/// [r c, (r + 1) c) then [(2cp - 1 - r) c, (2cp - r) c), c = local_len / 2.
/// Errors: local_len odd (with cp_size > 1).
std::vector<int64_t> context_parallel_positions(int64_t local_len, int64_t cp_size, int64_t cp_rank);

/// out [..., P * n, ...]: `x` [..., n, ...] of every rank of `pg` concatenated along `dim` in
/// rank order. Differentiable: the backward reduce-scatters (sums) the gradient over `pg` and
/// hands each rank its block. Collective. Blocks until done. Plain (non-distributed) tensors only.
Tensor all_gather_along(const Tensor& x, int64_t dim, const std::shared_ptr<ProcessGroup>& pg);

/// Exact attention over a context-parallel group. q [B, Hq, 2c, D], k / v [B, Hkv, 2c, D] hold
/// this rank's load-balanced slice (context_parallel_shard along dim 2) of sequences of length
/// 2c * P, P = pg->size(); GQA as sdpa (Hq % Hkv == 0). Returns this rank's slice of
/// scaled_dot_product_attention(q_full, k_full, v_full, is_causal, scale, window), [B, Hq, 2c, Dv]:
/// K / V all-gathered over `pg` (see the file comment), causal mask and window on global
/// positions. Differentiable in q, k, v. Collective.
/// `document_ids` (sequence packing; i64 [B, 2c], this rank's slice of the rows' document ids,
/// undefined = none): attention stays inside each document (SdpaMask: the local ids for the
/// queries, the all-gathered ones for the keys), as sdpa with q_document_ids on the whole rows.
/// Errors: an odd local length, q / k / v local lengths that differ, sdpa's shape errors.
Tensor context_parallel_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const std::shared_ptr<ProcessGroup>& pg, bool is_causal = true,
                                  std::optional<double> scale = std::nullopt, int64_t window = 0,
                                  const Tensor& document_ids = Tensor());

/// A module whose forward runs attention over context-parallel slices once it is given the cp
/// group (models' attention layers implement it; parallel/ never includes models/).
class ContextParallelModule {
 public:
  virtual ~ContextParallelModule() = default;
  /// The cp group (null or size 1: whole sequences, the default). Inputs of later forwards are
  /// this rank's load-balanced slices (context_parallel_shard along the sequence dim).
  virtual void set_context_parallel(std::shared_ptr<ProcessGroup> cp_group) = 0;
};

/// Gives every ContextParallelModule under `model` the group of the 1-d `cp_mesh`; returns how
/// many there are. Errors: cp_mesh not 1-d.
int apply_context_parallel(nn::Module& model, const DeviceMesh& cp_mesh);

}  // namespace dtr
