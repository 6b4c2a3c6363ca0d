#pragma once
// Redistribution of a distributed tensor between any two placement lists on its mesh.
// Plan (n-d): walk mesh dims in reverse application order (left to right, except that a strided
// shard paired with later TP dims applies after them) undoing every shard that changes or whose
// prefix (the shards applied before it on its tensor dim) changes, then in the target's
// application order apply the targets. Any placement list can become any other, except a shard
// becoming Partial. Transitions: S->R all_gather, P->R all_reduce, P->S reduce_scatter, R->S local
// chunk, S(i)->S(j) all_to_all, R->P local scale; a lone strided shard <-> R gathers / splits its
// pieces of the blocks; uneven sizes padded for the collective and cut after.
// Source: PyTorch torch.distributed.tensor._redistribute.
#include "dtensor/spec.h"

namespace dtr {

/// One step of a plan: mesh dim `mesh_dim` goes from `from` to `to`.
struct RedistributeStep {
  int mesh_dim;
  Placement from;
  Placement to;
};

/// The steps that take `from` to `to` on spec.mesh (empty when equal).
/// Errors: Shard -> Partial; placement lists of the wrong length.
std::vector<RedistributeStep> plan_redistribute(const DTensorSpec& from, const Placements& to);

/// Executes a plan on the local shard (no autograd): returns the new local shard.
Tensor redistribute_local(const Tensor& local, const DTensorSpec& from, const Placements& to);

/// Redistributes `x` to `placements` on its mesh (differentiable: the gradient goes back to
/// x's placements, with Partial mapped to Replicate, as in PyTorch).
/// Errors: Shard -> Partial; placements.size() != mesh.ndim(); shard dim out of range.
Tensor redistribute(const Tensor& x, const Placements& placements);

}  // namespace dtr
