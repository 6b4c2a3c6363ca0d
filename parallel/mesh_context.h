#pragma once
// MeshContext: the device mesh and parallelism settings of a training job, built from a
// recipe's `distributed:` section with NeMo Automodel's key names. Mesh dims are ordered
// (pp, dp_replicate, dp_shard, cp, tp), tp fastest; flattened dims "dp" (= dp_replicate x
// dp_shard) and "dp_shard_cp" (= dp_shard x cp) are registered too.
// dp_size = world / (tp * cp * pp) when not given. Source: NeMo Automodel MeshContext /
// FSDP2Manager semantics (see ../shared/reference/nemo-automodel-semantics.md).
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/fsdp/mixed_precision.h"
#include "runtime/device_mesh.h"

namespace YAML {
class Node;
}

namespace dtr {

struct MeshContext {
  std::string strategy = "fsdp2";  // fsdp2 | ddp
  int64_t world_size = 1;
  int64_t dp_size = 1, dp_replicate_size = 1, dp_shard_size = 1;
  int64_t tp_size = 1, cp_size = 1, pp_size = 1, ep_size = 1;
  bool sequence_parallel = false;
  std::string activation_checkpointing = "none";  // none | full | selective
  std::string activation_checkpointing_scope = "all";
  /// Applied by fully_shard; with dp 1 (TP only, or one process) parallelize_model still wraps
  /// the units (fully_shard on the size-1 dp mesh) so that a set policy takes effect.
  MixedPrecisionPolicy mp_policy;
  /// `offload_policy`: true / false / null, or a map {_target_: ...CPUOffloadPolicy, pin_memory}
  /// (Automodel's form). dtr-train runs on the CPU, where FSDP's shards, gradients and optimizer
  /// state already live in host memory and the optimizer steps there: the policy holds without
  /// moving anything (str() says so). fully_shard refuses it for CUDA parameters (not built).
  OffloadPolicy offload_policy;
  /// NeMo's FSDP2Manager key: true (default) syncs gradients (FSDP reduce-scatter, DDP
  /// all-reduce) on the last micro-batch of a step only; false reduces after every micro-batch,
  /// so unsharded gradients never outlive their backward (gradient memory 1/dp of the model for
  /// full fine-tunes) at the cost of one reduction per micro-batch. Same results either way.
  bool defer_fsdp_grad_sync = true;
  std::optional<bool> reshard_after_forward;
  bool enable_fsdp2_prefetch = true;
  int fsdp2_forward_prefetch_depth = 1;
  int fsdp2_backward_prefetch_depth = 2;
  /// `tp_plan`: module-name pattern -> style name (parallel/tensor_parallel/plan_from_names.h), in
  /// recipe order. When given, parallelize_model uses it instead of the model parallelizer's plan
  /// (every pattern must match a module); sequence_parallel then only means what the plan says.
  std::vector<std::pair<std::string, std::string>> tp_plan;
  /// The 5-d mesh (pp, dp_replicate, dp_shard, cp, tp); built by build_mesh().
  std::shared_ptr<DeviceMesh> mesh;
  /// ep_size > 1: the MoE mesh (pp, dp_replicate, ep_shard, ep, tp) over the same ranks, ep carved
  /// out of dp_shard_cp (ep fastest, so an ep group is ep consecutive dp_shard ranks).
  std::shared_ptr<DeviceMesh> moe_mesh;

  /// Parses and validates `distributed` (a YAML map; `where` names it in errors, e.g.
  /// "configs/x.yaml: distributed"). Errors (dtr::Error, one line naming the key and the
  /// numbers): unknown key, wrong type, sizes < 1, world % (tp*cp*pp) != 0, dp*tp*cp*pp !=
  /// world, dp % dp_replicate != 0, pp > 1 (not built yet), dp_shard_cp % ep != 0, ep > 1 with ddp,
  /// sequence_parallel or cp > 1, cp > 1 with ddp, unknown strategy, ddp with
  /// tp > 1 or dp_replicate > 1. Does not create process groups.
  static MeshContext from_yaml(const YAML::Node& distributed, int64_t world_size, const std::string& where);
  /// The same validation for a context filled in code.
  void validate(const std::string& where) const;
  /// Creates the mesh and its flattened dims (collective: every rank calls it).
  void build_mesh();

  /// 1-d TP mesh (size tp_size).
  DeviceMesh tp_mesh() const;
  /// The mesh FSDP shards over: 1-d "dp_shard_cp" (dp_shard x cp: context-parallel ranks hold
  /// other tokens, so their gradients are averaged too), or 2-d (dp_replicate, dp_shard_cp) for HSDP.
  DeviceMesh fsdp_mesh() const;
  /// FSDP + TP: the data-parallel mesh with tp appended: (dp_shard_cp, tp), or (dp_replicate,
  /// dp_shard_cp, tp) for HSDP. The "tp" dim is the mesh of the TP DTensors (tp_mesh()).
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
  /// This rank's index among the data-parallel ranks, and their number.
  int64_t dp_rank() const;
  std::string str() const;
};

}  // namespace dtr
