#pragma once
// FSDP2 policies and options: MixedPrecisionPolicy, OffloadPolicy, FSDPOptions.
// Source: torch.distributed.fsdp (FSDP2) MixedPrecisionPolicy / OffloadPolicy / fully_shard args.
#include <optional>

#include "tensor/dtype.h"

namespace dtr {

/// Mixed precision of one FSDP unit. Unset dtypes mean "no cast".
/// - param_dtype: dtype of the unsharded (all-gathered) parameters used for compute; the
///   sharded parameters (the optimizer's master copy) keep their own dtype. The all-gather
///   runs in param_dtype (the local shards are cast before the collective).
/// - reduce_dtype: dtype of the gradient reduce-scatter / all-reduce (default: param_dtype);
///   under FSDP + TP also of the tp all-reduce of Partial gradients (replicated parameters used
///   on sequence-sharded activations), which are cast before they are reduced.
///   Unsynced gradient accumulation keeps the unsharded gradients in reduce_dtype.
/// - output_dtype: the root unit casts its floating outputs to it.
/// - cast_forward_inputs: every unit casts its floating forward inputs to param_dtype.
/// Allowed dtypes: f32, f64, bf16, f16 (fully_shard throws otherwise).
struct MixedPrecisionPolicy {
  std::optional<DType> param_dtype;
  std::optional<DType> reduce_dtype;
  std::optional<DType> output_dtype;
  bool cast_forward_inputs = true;
  /// True when some dtype is set (the policy casts something).
  bool any_dtype() const { return param_dtype || reduce_dtype || output_dtype; }
};

/// CPU offload of sharded parameters, gradients and optimizer state (FSDP2's CPUOffloadPolicy:
/// shards in host memory, all-gathers copied to the device, gradients copied back, optimizer step
/// on the CPU). For CPU parameters that is already the case, so nothing is moved; fully_shard
/// refuses the policy for CUDA parameters (offloading them is not built yet).
struct OffloadPolicy {
  bool enabled = false;
  bool pin_memory = true;
};

/// Options of fully_shard.
/// - reshard_after_forward: free the unsharded parameters after the unit's forward and
///   all-gather them again before its backward (ZeRO-3); false keeps them until after backward
///   (ZeRO-2). The root unit is never resharded after forward (PyTorch does the same).
/// - forward_prefetch_depth: in forward, a unit issues the all-gathers of the next N units (in
///   the forward order recorded in the previous iteration) right after its own.
/// - backward_prefetch_depth: in backward, a unit issues the all-gathers of the next N units in
///   backward order (reverse post-forward order).
struct FSDPOptions {
  bool reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
  OffloadPolicy offload_policy;
  int forward_prefetch_depth = 1;
  int backward_prefetch_depth = 1;
  /// What the reduced gradients are divided by (PyTorch's set_gradient_divide_factor); unset:
  /// the product of the unit's dp dims. Expert parallelism sets the whole dp size for the experts'
  /// units, whose FSDP mesh leaves out the ep dim that the token all-to-all already summed over.
  std::optional<double> gradient_divide_factor;
};

}  // namespace dtr
