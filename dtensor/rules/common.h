#pragma once
// Helpers shared by the sharding rules.
#include "dtensor/propagation.h"
#include "tensor/ops/shape.h"

namespace dtr::rules {

/// Placements an input of shape `in` needs so that it lines up (by right-aligned
/// broadcasting) with an output of shape `out` placed by `out_pl`: output Shard(d) becomes
/// Shard of the matching input dim, or Replicate where the input is broadcast along it
/// (StridedShard alike). Partial entries are copied as they are.
Placements map_to_input(const Placements& out_pl, const Shape& out, const Shape& in);

/// This rank's local shape of a tensor of global `shape` placed by `pl` on `mesh`.
Shape local_shape_of(const DeviceMesh& mesh, const Shape& shape, const Placements& pl);

/// A decision with one candidate list: the cheapest strategy, with output shapes.
ShardingDecision decide(const OpSchema& s, const std::vector<Strategy>& candidates, std::vector<Shape> out_shapes);

/// Placements `p` with Partial turned into Replicate unless its reduce op is in `keep`.
Placements partial_to_replicate_unless(const Placements& p, std::initializer_list<ReduceOp> keep);

}  // namespace dtr::rules
