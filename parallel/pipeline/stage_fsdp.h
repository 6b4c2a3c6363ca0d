#pragma once
// FSDP inside pipeline stages. Under pipeline parallelism a stage runs several forwards before
// their backwards (and, with 1F1B, forwards between backwards), which the per-iteration FSDP
// hooks do not follow. So, as PyTorch's pipelining + FSDP2 with reshard_after_forward=False
// (Automodel's setting under PP) behaves, each unit of a stage is gathered once before the
// step's first micro-batch, stays unsharded while the micro-batches accumulate gradients into
// its unsharded leaves, and after the last backward reduce-scatters them (HSDP: all-reduce over
// the replicate dim too) and reshards. Source: torch.distributed.pipelining.stage
// (_PipelineStageBase: FSDP unshard / reshard around the schedule, gradient sync on the last
// backward only).
#include "tensor/nn/module.h"

namespace dtr {

/// Turns the FSDP hooks of the units under `stage` off (set_fsdp_hooks_enabled), so that
/// pipeline_unshard / pipeline_reduce_gradients drive them. No-op when `stage` holds no unit.
void manage_fsdp_for_pipeline(nn::Module& stage);
/// Every unit under `stage`: re-reads requires_grad, issues all all-gathers, then waits for them
/// (pre-order, the same order on every dp rank). No-op without units.
void pipeline_unshard(nn::Module& stage);
/// Every unit under `stage`: reduce-scatters the accumulated gradients (all issued, then waited),
/// adds them into the sharded .grad (averaged over dp) and reshards. No-op without units.
void pipeline_reduce_gradients(nn::Module& stage);
/// Every unit under `stage`: reshards without reducing (after forward-only evaluation).
void pipeline_reshard(nn::Module& stage);

}  // namespace dtr
