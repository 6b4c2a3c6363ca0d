#pragma once
// Expert parallelism: the experts of every nn::MoE block sharded over an "ep" mesh dim, tokens
// moved to the ranks holding their experts and back with all-to-alls of variable sizes.
//   dispatch: the token copies (sorted by global expert) go in contiguous blocks to the owner of
//             each expert (rank j owns experts [j E/ep, (j+1) E/ep)); the received rows, ordered
//             by (source rank, local expert), are regrouped by (local expert, source rank) for
//             the grouped GEMM. The counts are exchanged first (one all_to_all of E int64).
//   combine:  the inverse regrouping, then the all-to-all back.
// Both all-to-alls are differentiable (the backward is the all-to-all with the splits swapped).
// Source: torchtitan ExpertParallel (_token_dispatch / _token_combine), Megatron-LM
// MoEAlltoAllTokenDispatcher, NeMo Automodel's MoE parallelizer (experts Shard(0) on ep).
#include <memory>

#include "runtime/device_mesh.h"
#include "tensor/nn/moe.h"

namespace dtr {

/// out [sum(out_splits), ...] = rows of `x` exchanged over `pg`: x's first in_splits[j] rows
/// (after the earlier blocks) go to rank j; out's block j comes from rank j. Differentiable: the
/// gradient goes back by the all-to-all with out_splits and in_splits swapped. Blocks until done.
/// Errors: those of ProcessGroup::all_to_all (split counts, sums, dtypes).
Tensor all_to_all_single(const Tensor& x, const Shape& out_splits, const Shape& in_splits,
                         const std::shared_ptr<ProcessGroup>& pg);

/// The TokenDispatcher of one MoE block over the 1-d ep mesh (see the file comment). The experts'
/// parameters must be DTensors Shard(0) on that mesh (apply_expert_parallel makes them so).
class AllToAllTokenDispatcher : public nn::TokenDispatcher {
 public:
  AllToAllTokenDispatcher(DeviceMesh ep_mesh, int64_t num_experts);
  std::pair<Tensor, Shape> dispatch(const Tensor& x, const Shape& counts) override;
  Tensor combine(const Tensor& y) override;
  Tensor local_experts(const Tensor& w) override;

 private:
  DeviceMesh mesh_;
  std::shared_ptr<ProcessGroup> pg_;
  int64_t num_experts_, local_experts_;
  // the last dispatch, for combine
  Shape in_splits_, out_splits_;
  Tensor to_source_order_;  // [R]: row of the expert-ordered buffer for each received row
  Tensor to_expert_order_;  // [R]: received row for each row of the expert-ordered buffer
};

/// Shards the experts of every nn::MoE under `model` over the 1-d `ep_mesh`: gate_up_proj and
/// down_proj become DTensors Shard(0) (every rank must hold the same initial values; they are
/// distributed from mesh rank 0) and the block gets an AllToAllTokenDispatcher. Returns the number
/// of MoE blocks. Errors: num_experts % ep size != 0 (names the block and both numbers).
int apply_expert_parallel(nn::Module& model, const DeviceMesh& ep_mesh);

}  // namespace dtr
