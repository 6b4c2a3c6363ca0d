#pragma once
// Resharding of distributed checkpoints: where a rank's block of a (plain or distributed)
// tensor sits in the global tensor, and the assembly of a block from saved blocks of any other
// sharding (another mesh, other placements, replicated copies). Tensor ops only (narrow +
// copy_), so blocks may live on any device. The storage (files, their format, the commit
// protocol) is the caller's: parallel/checkpoint/state_dict.h saves each rank's local_block
// and loads through assemble_block.
// Source: PyTorch torch.distributed.checkpoint (ChunkStorageMetadata offsets / sizes; the load
// planner reads every saved chunk overlapping a local shard).
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace dtr {

/// A block of a global tensor: `tensor` holds the elements [offset, offset + tensor.sizes()).
struct TensorBlock {
  Tensor tensor;
  Shape offset;
};

/// This rank's block of `t` and the global shape: a DTensor's local shard (sharing its storage)
/// at DTensorSpec::local_offset(), or the whole of a plain tensor at offset 0.
/// Errors: a local shard whose shape differs from its spec's local shape; a StridedShard whose
/// partner mesh dims are not in the placements (its rows are several ranges, not one block).
TensorBlock local_block(const Tensor& t, Shape* global_shape = nullptr);

/// True when the boxes [a_offset, a_offset + a_sizes) and [b_offset, b_offset + b_sizes) share
/// an element (same rank assumed).
bool blocks_overlap(const Shape& a_offset, const Shape& a_sizes, const Shape& b_offset, const Shape& b_sizes);

/// Copies the overlap of `src` into `dst` (both blocks of the same global tensor); returns the
/// number of elements copied (0: disjoint). Errors: ranks or dtypes differ.
int64_t copy_overlap(const TensorBlock& src, const TensorBlock& dst);

/// Fills `dst` from the saved blocks that overlap it (a replicated element may be covered by
/// several; any copy is taken). Errors: an element of `dst` that no block covers -> dtr::Error
/// "<what> cover N of M elements of this rank's block (offset ..., shape ...)" (`what` names
/// the saved blocks, e.g. "checkpoint: shards of model/w in <dir>").
void assemble_block(const std::vector<TensorBlock>& saved, const TensorBlock& dst, const std::string& what);

}  // namespace dtr
