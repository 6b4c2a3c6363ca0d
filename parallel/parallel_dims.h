#pragma once
// ParallelDims: the degrees of parallelism of a job (sizes, derived sizes, validation) and the
// device meshes built from them. A pure object: no recipe parsing (dtr-train's reader is
// apps/train/distributed_config.h), no policy (strategy, FSDP options: MeshContext).
// Mesh dims are ordered (pp, dp_replicate, dp_shard, cp, tp), tp fastest; flattened dims "dp"
// (= dp_replicate x dp_shard), "dp_shard_cp" (= dp_shard x cp) and "dp_cp" (= dp_replicate x
// dp_shard x cp; torchtitan's names) are registered too.
// Adding a dim: a `<name>_size` field, an entry in mesh_dims() (and in model_parallel_dims()
// when it divides the world before dp does), its checks in validate(), its mesh accessor.
// Source: torchtitan torchtitan/distributed/parallel_dims.py (a pure object: degrees,
// validation, mesh building), NeMo Automodel's size names (dp_size, dp_replicate_size, ...).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device_mesh.h"

namespace dtr {

struct ParallelDims {
  int64_t world_size = 1;
  /// Data-parallel ranks: dp_replicate_size (HSDP replicas) x dp_shard_size() (FSDP shards).
  int64_t dp_size = 1, dp_replicate_size = 1;
  int64_t tp_size = 1, cp_size = 1, pp_size = 1;
  /// Expert parallelism: carved out of dp_shard_cp (the MoE mesh), not a dim of `mesh`.
  int64_t ep_size = 1;

  /// One dim of the mesh: its name and degree.
  using Dim = std::pair<std::string, int64_t>;
  /// The dims of `mesh`, outermost first: (pp, dp_replicate, dp_shard, cp, tp).
  std::vector<Dim> mesh_dims() const;
  /// The degrees that divide the world before dp is derived: (tp, cp, pp), recipe key names.
  std::vector<Dim> model_parallel_dims() const;

  int64_t dp_shard_size() const { return dp_size / dp_replicate_size; }
  /// FSDP's shard group with context parallelism folded in (Automodel's dp_shard_cp).
  int64_t dp_shard_cp_size() const { return dp_shard_size() * cp_size; }
  /// The MoE mesh's ep_shard: dp_shard_cp / ep.
  int64_t ep_shard_size() const { return dp_shard_cp_size() / ep_size; }

  /// dp_size = world_size / (tp * cp * pp) (NeMo's default when dp_size is not given).
  /// Errors (`where` prefixes them, e.g. "configs/x.yaml: distributed"): a degree < 1, the
  /// product overflowing int64, world_size not divisible by it.
  void infer_dp_size(const std::string& where);
  /// Checks the sizes: every degree >= 1, dp*tp*cp*pp == world_size (no int64 overflow),
  /// dp % dp_replicate == 0, pp > 1 with cp or ep > 1, ep > 1 with cp > 1 (not built),
  /// dp_shard_cp % ep == 0.
  /// Errors: dtr::Error, one line naming the key and the numbers.
  void validate(const std::string& where) const;

  /// Creates `mesh` with its flattened dims, and `moe_mesh` when ep_size > 1, on `device` (the
  /// FSDP / TP buffers and collectives then live there: MPI for CPU, NCCL or MPI staging for
  /// CUDA). Collective: every rank calls it.
  void build_mesh(Device device = Device::cpu());
  /// The 5-d mesh (pp, dp_replicate, dp_shard, cp, tp); built by build_mesh().
  std::shared_ptr<DeviceMesh> mesh;
  /// ep_size > 1: the MoE mesh (pp, dp_replicate, ep_shard, ep, tp) over the same ranks, ep
  /// carved out of dp_shard_cp (ep fastest, so an ep group is ep consecutive dp_shard ranks).
  std::shared_ptr<DeviceMesh> moe_mesh;

  /// 1-d TP mesh (size tp_size).
  DeviceMesh tp_mesh() const;
  /// The mesh FSDP shards over: 1-d "dp_shard_cp" (dp_shard x cp: context-parallel ranks hold
  /// other tokens, so their gradients are averaged too), or 2-d (dp_replicate, dp_shard_cp) for HSDP.
  DeviceMesh fsdp_mesh() const;
  /// FSDP + TP: the data-parallel mesh with tp appended: (dp_shard_cp, tp), or (dp_replicate,
  /// dp_shard_cp, tp) for HSDP. Its last dim is the mesh of the TP DTensors (tp_mesh()).
  DeviceMesh fsdp_tp_mesh() const;
  /// Expert parallelism (ep_size > 1): the 1-d "ep" mesh the experts are sharded over, and the
  /// mesh their FSDP runs on: (ep_shard, ep), or (dp_replicate, ep_shard, ep) with HSDP.
  DeviceMesh ep_mesh() const;
  DeviceMesh expert_fsdp_mesh() const;
  /// 1-d context-parallel mesh (size cp_size): the ranks that hold slices of the same sequences.
  DeviceMesh cp_mesh() const;
  /// 1-d flattened (dp_replicate, dp_shard, cp) mesh: every rank that holds other tokens of the
  /// global batch (the loss and label-token sums run over it).
  DeviceMesh dp_cp_mesh() const;
  /// 1-d flattened dp mesh (all data-parallel ranks).
  DeviceMesh dp_mesh() const;
  /// This rank's index among the data-parallel ranks (their number is dp_size).
  int64_t dp_rank() const;

  /// "world=8 dp=4 (replicate 2 x shard 2) tp=2[ cp=2][ ep=2 (ep_shard 2)]".
  std::string str() const;
};

}  // namespace dtr
