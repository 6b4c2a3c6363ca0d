#pragma once
// Redistribution of a distributed tensor between any two placement lists on its mesh.
// Plan (n-d): walk mesh dims in reverse application order (left to right, except that a strided
// shard paired with later TP dims applies after them) undoing every shard that changes or whose
// prefix (the shards applied before it on its tensor dim) changes, then in the target's
// application order apply the targets. Any placement list can become any other, except a shard
// becoming Partial. Every step is an entry of the transition table (dtensor/transition.h): the
// planner picks it (a pair without an entry goes through Replicate), the executor runs it, and
// redistribute_comm / redistribute_cost take its figures.
// Source: PyTorch torch.distributed.tensor._redistribute.
#include "dtensor/spec.h"
#include "dtensor/transition.h"

namespace dtr {

/// One step of a plan: mesh dim `mesh_dim` goes from `from` to `to`.
struct RedistributeStep {
  int mesh_dim;
  Placement from;
  Placement to;
  const Transition* transition;  // the table entry that takes the step
};

/// The steps that take `from` to `to` on spec.mesh (empty when equal).
/// Errors: Shard -> Partial; placement lists of the wrong length.
std::vector<RedistributeStep> plan_redistribute(const DTensorSpec& from, const Placements& to);

/// Executes a plan on the local shard (no autograd): returns the new local shard.
Tensor redistribute_local(const Tensor& local, const DTensorSpec& from, const Placements& to);

/// One collective call of a plan: on the group of `mesh_dim`, `bytes` as CommCounters counts
/// them (the call's input bytes, padding included).
struct RedistributeComm {
  int mesh_dim;
  CommKind kind;
  int64_t bytes;
};
/// The collective calls redistribute_local issues on this rank for `from` -> `to`, in order,
/// from the plan's table entries without running them (size-1 mesh dims issue none).
/// Errors: as plan_redistribute.
std::vector<RedistributeComm> redistribute_comm(const DTensorSpec& from, const Placements& to);

/// Redistributes `x` to `placements` on its mesh (differentiable: the gradient goes back to
/// x's placements, with Partial mapped to Replicate, as in PyTorch).
/// Errors: Shard -> Partial; placements.size() != mesh.ndim(); shard dim out of range.
Tensor redistribute(const Tensor& x, const Placements& placements);

}  // namespace dtr
