#pragma once
// Helpers shared by the sharding rules of the nn ops (softmax, norms, rope, attention,
// embedding, loss, dropout, cat): placement clean-up, local offsets, noted collectives.
#include <initializer_list>

#include "dtensor/comm_debug.h"
#include "dtensor/rules/common.h"

namespace dtr::rules {

/// `p` with every mesh dim that is not a plain Shard of a dim outside `whole` made Replicate
/// (Partial, StridedShard and Shard of a dim in `whole` -> Replicate).
inline Placements shard_only(const Placements& p, std::initializer_list<int64_t> whole = {}) {
  Placements out = p;
  for (auto& x : out) {
    bool keep = x.is_shard();
    for (int64_t d : whole)
      if (x.is_shard(d)) keep = false;
    if (!keep) x = Replicate();
  }
  return out;
}

/// This rank's global offset of a tensor of global `shape` placed by `pl` on `mesh`.
inline Shape local_offset_of(const DeviceMesh& mesh, const Shape& shape, const Placements& pl) {
  Shape ls, off;
  local_shape_and_offset(shape, mesh.shape(), pl, mesh.get_coordinate(), ls, off);
  return off;
}

/// The cheapest of `candidates` when every input listed in `inputs` is brought to it (total
/// redistribution cost of those inputs; the first wins ties). Candidates must hold no Partial.
inline const Placements& cheapest(const OpSchema& s, const std::vector<Placements>& candidates,
                                  std::initializer_list<size_t> inputs) {
  const Placements* best = nullptr;
  double best_cost = 0;
  for (const auto& c : candidates) {
    double cost = 0;
    for (size_t i : inputs)
      if (i < s.specs.size() && s.specs[i]) cost += redistribute_cost(*s.specs[i], c);
    if (!best || cost < best_cost) {
      best = &c;
      best_cost = cost;
    }
  }
  return *best;
}

/// In-place all_reduce of a contiguous local tensor over mesh dim `dim` (noted for CommDebugMode).
inline void all_reduce_mesh_dim(const DeviceMesh& mesh, int dim, Tensor& t, ReduceOp op) {
  comm_debug_note(CommKind::all_reduce);
  mesh.group(dim)->all_reduce(t, op)->wait();
}

}  // namespace dtr::rules
