#pragma once
// MeshContext: how a training job is parallelized: its ParallelDims (degrees and meshes) plus
// the policies parallelize_model applies (data-parallel strategy, sequence parallelism,
// activation checkpointing, the FSDP2 options). Filled in code or by dtr-train's recipe reader
// (apps/train/distributed_config.h, NeMo Automodel's `distributed:` keys).
// Source: NeMo Automodel FSDP2Manager / DDPManager fields (see
// ../shared/reference/nemo-automodel-semantics.md).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/activation_checkpoint.h"
#include "parallel/fsdp/mixed_precision.h"
#include "parallel/parallel_dims.h"
#include "parallel/pipeline/pipeline_config.h"

namespace dtr {

/// NeMo's `distributed.strategy`: FSDP2 (fully_shard, with TP / EP / HSDP) or DDP (replicate).
enum class DataParallelStrategy { fsdp2, ddp };
/// "fsdp2" / "ddp".
const char* strategy_name(DataParallelStrategy s);

struct MeshContext : ParallelDims {
  DataParallelStrategy strategy = DataParallelStrategy::fsdp2;
  bool sequence_parallel = false;
  /// `pipeline`: schedule, micro-batch size and stage split when pp_size > 1.
  PipelineConfig pipeline;
  /// Activation checkpointing of every layer; nullopt = none.
  std::optional<CheckpointPolicy> activation_checkpointing;
  std::string activation_checkpointing_scope = "all";
  /// Applied by fully_shard; with dp 1 (TP only, or one process) parallelize_model still wraps
  /// the units (fully_shard on the size-1 dp mesh) so that a set policy takes effect.
  MixedPrecisionPolicy mp_policy;
  /// CPU offload (Automodel's CPUOffloadPolicy). On the CPU, FSDP's shards, gradients and
  /// optimizer state already live in host memory and the optimizer steps there: the policy
  /// holds without moving anything (str() says so). fully_shard refuses it for CUDA parameters
  /// (not built).
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

  /// ParallelDims::validate, then the combinations the strategy does not support. Errors
  /// (dtr::Error, one line naming the key, `where` prefixing it): ep > 1 with ddp or with
  /// sequence_parallel, ddp with cp > 1, tp > 1, dp_replicate > 1, mp_policy or offload_policy,
  /// negative prefetch depths. Does not create process groups.
  void validate(const std::string& where) const;
  /// "strategy=fsdp2 world=... activation_checkpointing=none ..." (logs, checkpoint metadata).
  std::string str() const;
};

}  // namespace dtr
