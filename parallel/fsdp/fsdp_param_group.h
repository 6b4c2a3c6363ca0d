#pragma once
// FSDPParamGroup: the parameters of one fully_shard unit, their Shard(0) storage in one flat
// padded buffer, the flat all-gather that rebuilds the unsharded parameters and the flat
// reduce-scatter of their gradients. Scheduling (hooks, prefetch, root) lives in fully_shard.cpp.
// FSDP + TP: a parameter that is a tensor-parallel DTensor is sharded along dim 0 of its TP-local
// tensor; the all-gather rebuilds that TP-local tensor (the unsharded parameter is the TP DTensor
// again) and the reduce-scatter runs on the TP-local gradient, over the dp dims only.
// Every buffer lives on the mesh's device and is moved by tensor ops only (chunk_cat for the
// reduce-scatter copy-in, split_with_sizes_copy for the all-gather copy-out, narrow / copy_ /
// casts), so the same code runs on CPU (MPI) and CUDA (NCCL, or MPI staging) tensors.
// Source: torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py and _fsdp_collectives.py.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/spec.h"
#include "parallel/fsdp/mixed_precision.h"
#include "runtime/device_mesh.h"
#include "tensor/nn/module.h"

namespace dtr {

/// One parameter managed by a unit.
struct FSDPParam {
  std::vector<std::string> fqns;  // names relative to the unit's module (several when tied)
  Shape shape;                    // the tensor FSDP splits: global shape, or TP-local shape (FSDP + TP)
  Shape global_shape;             // the parameter's global shape
  int64_t rows = 0;               // shape[0]
  int64_t row_numel = 1;          // product of shape[1:]
  int64_t chunk_rows = 0;         // ceil(rows / shard size): rows of every padded shard
  int64_t local_rows = 0;         // this rank's real rows (torch.chunk)
  int64_t shard_offset = 0;       // element offset in the flat shard buffer (one rank's segment)
  int64_t grad_offset = -1;       // element offset in one rank's reduce-scatter segment (-1: frozen)
  bool hooked = false;            // the post-accumulate-grad hook is registered on `unsharded`
  bool trainable = false;         // reduced by the unit (requires_grad as of the unit's last pre-forward)
  std::optional<DTensorSpec> spec;  // Shard(0) (HSDP: Replicate x Shard(0)); FSDP + TP: x TP placement
  std::optional<DTensorSpec> tp_spec;  // FSDP + TP: the parameter's TP spec (1-d tp mesh), else none
  Tensor sharded;                 // the DTensor parameter (leaf) the optimizer steps
  Tensor unsharded;               // leaf in param_dtype (a TP DTensor under FSDP + TP); storage freed when resharded
  Tensor padded;                  // [shard size * padded_numel()] all-gather copy-out target: its first
                                  // rows * row_numel elements are unsharded_local() (same storage)
  Tensor acc_grad;                // unsynced accumulation in reduce_dtype (when != param_dtype); like
                                  // unsharded.grad(), a TP DTensor under FSDP + TP (Partial kept)
  // Frozen-parameter reuse (FSDPParamGroup::reshard(true)): `padded` keeps its storage while the
  // unit is sharded, and the next unshard skips the parameter when the versions of its shard
  // (local tensor and DTensor) and of its unsharded tensor still equal those at its last gather.
  bool kept = false;
  uint32_t gathered_versions[4] = {0, 0, 0, 0};
  /// The versions compared by the reuse check (sharded local, sharded DTensor, unsharded, its local).
  void versions(uint32_t out[4]) const;
  /// True when a frozen parameter's gathered values are still current: frozen and its versions
  /// equal gathered_versions (nothing wrote the shard or the unsharded tensor since the gather).
  bool reusable() const;
  int64_t padded_numel() const { return chunk_rows * row_numel; }
  /// Rows rank r of the shard dim holds.
  int64_t rows_of(int64_t r) const;
  /// The plain tensor holding the unsharded values (the TP-local tensor under FSDP + TP).
  const Tensor& unsharded_local() const;
};

/// The parameters of one unit and their collectives.
class FSDPParamGroup {
 public:
  /// Shards `params` (name lists + full tensors, all of one dtype, dim >= 1, leaves) of `module`
  /// over `mesh` (1-d: Shard(0); 2-d (replicate, shard): Replicate x Shard(0)) and registers the
  /// sharded DTensors in the module. Each rank copies its torch.chunk rows of the full tensor
  /// (no communication: every rank must hold the same initial values, as in PyTorch).
  /// FSDP + TP (`tp_layout`: the mesh's last dim is the tp mesh of the DTensor parameters, the
  /// dims before it are (shard) or (replicate, shard)): a TP DTensor parameter is split along dim
  /// 0 of its local tensor and placed [dp..., Shard(0) or StridedShard(0, tp) when TP shards dim
  /// 0, TP placement]; plain parameters are [dp..., Shard(0), Replicate()]. fully_shard checks
  /// that the meshes match.
  FSDPParamGroup(nn::Module& module, std::vector<std::pair<std::vector<std::string>, Tensor>> params,
                 const DeviceMesh& mesh, const FSDPOptions& opt, std::string label, bool tp_layout = false);
  ~FSDPParamGroup();
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  /// Issues the flat all-gather (async) when sharded and none is in flight.
  void unshard_async();
  /// Waits for the all-gather, copies the rows out into the unsharded parameters and registers
  /// them in the module. No-op when already unsharded.
  void wait_unshard();
  /// Frees the unsharded parameters' storage and registers the sharded DTensors again.
  /// keep_frozen: frozen parameters keep their unsharded storage (and values); the next
  /// unshard gathers only the other parameters while a kept one's shard is unchanged (its
  /// version counters: optimizer steps, copy_ / load_state_dict into the shard, in-place writes
  /// to the unsharded tensor all bump them). The module sees the sharded DTensors either way.
  void reshard(bool keep_frozen = false);
  bool is_unsharded() const { return unsharded_; }
  bool gather_in_flight() const { return gather_work_ != nullptr; }
  /// Waits for an in-flight all-gather and drops its result (end of backward clean-up).
  void drop_gather();

  /// Packs the unsharded gradients (in reduce_dtype, each padded to chunk_rows) into one flat
  /// buffer, issues the reduce-scatter over the shard dim (async) and clears the unsharded
  /// gradients. Missing gradients count as zeros. No-op for a unit without trainable params.
  void reduce_grads_async();
  /// Step 1 of finishing: waits for the reduce-scatter; HSDP issues the replicate all_reduce.
  void finish_reduce_scatter();
  /// Step 2: waits for the all_reduce, divides by the dp size and adds the shards into the
  /// sharded parameters' .grad (Shard(0) DTensors in the parameter dtype).
  void finish_reduce_apply();
  bool reduce_pending() const { return rs_work_ != nullptr || ar_work_ != nullptr || rs_out_.defined(); }
  /// The reduce-scatter is issued and not yet waited for (its input is alive).
  bool reduce_scatter_in_flight() const { return rs_work_ != nullptr; }
  /// HSDP: the replicate all_reduce is issued and not yet waited for.
  bool all_reduce_in_flight() const { return ar_work_ != nullptr; }
  /// Re-derives which parameters the unit reduces from their requires_grad, so a parameter
  /// frozen or unfrozen after fully_shard is honoured (FSDP2 semantics): the sharded DTensor's
  /// flag decides (the unsharded leaf's when only that one was changed, e.g. while the root
  /// stayed gathered after an eval forward); both are then set alike and the reduce-scatter
  /// layout is rebuilt. fully_shard calls it at every pre-forward, so a change takes effect from
  /// the unit's next forward. Errors: freezing a parameter that holds unsynced accumulated
  /// gradients (set_requires_gradient_sync(false)); a change while a reduction is pending.
  void sync_requires_grad();
  /// Unsynced micro-step: moves the unsharded gradients into reduce_dtype accumulators when
  /// reduce_dtype differs from param_dtype (otherwise they stay on the unsharded leaves).
  void accumulate_unsynced();

  std::vector<FSDPParam>& params() { return params_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  int num_trainable() const { return num_trainable_; }
  const std::string& label() const { return label_; }
  /// Elements of one rank's flat shard / reduce-scatter segment (padding included).
  int64_t shard_numel() const { return shard_numel_; }
  int64_t grad_shard_numel() const { return grad_numel_; }
  DType param_dtype() const { return param_dtype_; }
  DType reduce_dtype() const { return reduce_dtype_; }
  const DeviceMesh& mesh() const { return mesh_; }
  /// FSDP + TP: the mesh's last dim is the parameters' tp mesh.
  bool tp_layout() const { return tp_layout_; }
  /// Called with the index of a trainable parameter after its unsharded .grad was accumulated.
  std::function<void(int)> on_grad_ready;

 private:
  void register_tensors(bool unsharded);
  /// Assigns grad_offset to the trainable parameters (their unsharded leaves require grad and
  /// carry the readiness hook); sets grad_numel_ and num_trainable_.
  void layout_grads();

  nn::Module& module_;
  DeviceMesh mesh_;
  bool tp_layout_ = false;
  std::shared_ptr<ProcessGroup> shard_pg_, replicate_pg_;
  int64_t shard_size_ = 1, dp_size_ = 1;  // dp_size_: product of the dp dims (tp excluded)
  double divide_factor_ = 1;              // gradients are divided by it (default dp_size_)
  std::string label_;
  std::vector<FSDPParam> params_;
  DType storage_dtype_ = DType::f32, param_dtype_ = DType::f32, reduce_dtype_ = DType::f32;
  Device device_;  // the mesh's device: every parameter and buffer of the unit lives there
  int64_t shard_numel_ = 0, grad_numel_ = 0;
  int num_trainable_ = 0;
  Tensor flat_shard_;  // [shard_numel_] in the storage dtype; params' local shards are views
  bool unsharded_ = false;
  // in-flight all-gather
  WorkPtr gather_work_;
  Tensor gather_in_, gather_out_;
  std::vector<int> gathering_;  // indices of the parameters the in-flight all-gather carries
  // in-flight reduction
  WorkPtr rs_work_, ar_work_;
  Tensor rs_in_, rs_out_;
};

}  // namespace dtr
