#pragma once
// The redistribution transitions of one mesh dim, as one table (OneFlow's boxing table; PyTorch's
// Placement._to_replicate_tensor / _to_new_shard_dim / _reduce_shard_value methods). Each entry
// connects two placement kinds and carries the collective it issues, the function that runs it
// on a local shard, the bytes this rank's process group counts for it and its strategy cost.
// plan_redistribute picks entries (a pair without an entry goes through Replicate),
// redistribute_local runs the chosen entry's function, redistribute_cost and redistribute_comm
// sum the entries' figures: there is no second list of cases.
//
// Entries (n = the mesh dim's group size; uneven sizes are padded for the collective, cut after):
//   shard -> replicate           all_gather      (padded to the largest rank's rows)
//   strided_pieces -> replicate  all_gather      (each rank's pieces of the sf blocks, re-interleaved)
//   shard -> shard               all_to_all      (S(i) -> S(j), j != i, no other mesh dim sharding i or j)
//   partial -> replicate         all_reduce
//   partial -> shard             reduce_scatter  (padded to n * ceil(rows / n))
//   replicate -> shard           local chunk
//   replicate -> strided_pieces  local split (this rank's piece of every block)
//   replicate -> partial         local: floating sum scaled by 1 / n, integer sum on coordinate 0
// Source: PyTorch torch.distributed.tensor._redistribute and placement_types.
#include <optional>
#include <vector>

#include "dtensor/spec.h"
#include "runtime/process_group.h"

namespace dtr {

/// What a placement is for the table: Shard(d) and a StridedShard paired with its TP dims hold
/// one chunk of the current level (shard); a StridedShard standing alone holds its piece of each
/// of its sf blocks (strided_pieces).
enum class PlacementKind : uint8_t { replicate, shard, strided_pieces, partial };
const char* placement_kind_name(PlacementKind k);

/// The kind of pl[i] on a mesh of `mesh_shape`.
PlacementKind placement_kind(const Placements& pl, const Shape& mesh_shape, int i);

/// One step as an entry sees it: mesh dim `mesh_dim` of the tensor `spec` (global shape, mesh,
/// dtype) goes from cur[mesh_dim] to `to`; `cur` holds every mesh dim's placement before the
/// step, `target` the placements the whole plan reaches.
struct TransitionStep {
  const DTensorSpec& spec;
  const Placements& cur;
  const Placements& target;
  int mesh_dim;
  Placement to;
  const Placement& from() const { return cur[mesh_dim]; }
};

/// One entry of the table.
struct Transition {
  PlacementKind from, to;
  std::optional<CommKind> collective;  // none: local only
  const char* name;
  /// Whether the entry may take `step` beyond matching kinds; null: always.
  bool (*applies)(const TransitionStep& step);
  /// The new local shard (no autograd) from `local`, the shard of step.cur; the mesh dim's group
  /// has more than one rank.
  Tensor (*run)(const Tensor& local, const TransitionStep& step);
  /// Bytes this rank's group counts for the collective (CommCounters: the input bytes of the
  /// call, padding included); null for a local entry.
  int64_t (*comm_bytes)(const TransitionStep& step);
  /// Strategy cost (PyTorch's idea: bytes moved) from `local_bytes`, the tensor's bytes divided by
  /// the sizes of the mesh dims that shard it before the step (the same on every rank), and the
  /// group size: all_gather local * n, all_reduce 2 * local, reduce_scatter / all_to_all local.
  double (*cost)(double local_bytes, double group_size);
};

/// Every entry, in the order above.
const std::vector<Transition>& transitions();

/// The entry that takes `step` (kinds of step.cur[mesh_dim] in cur and of `to` in cur with
/// mesh_dim replaced), or nullptr when the table has none.
const Transition* find_transition(const TransitionStep& step);

}  // namespace dtr
