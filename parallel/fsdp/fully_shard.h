#pragma once
// fully_shard: FSDP2 for nn::Module trees. Source: torch.distributed.fsdp.fully_shard (FSDP2)
// semantics, see /work/shared/reference/pytorch-dtensor-fsdp2-semantics.md.
//
// Usage (bottom-up, like PyTorch):
//   for (auto& layer : layers) fully_shard(*layer, mesh, opt);
//   fully_shard(model, mesh, opt);          // the root: claims what is left
//   AdamW optim(model.parameters(), ...);   // steps on the local shards only
//   loss = ...; loss.backward();            // reduce-scatters overlap the rest of backward;
//                                           // nothing to call after it ("Backward contract")
//   optim.step(); optim.zero_grad();
//
// What a call does: the module's parameters not claimed by an earlier call on a descendant
// become Shard(0) DTensors on `mesh` (1-d: [Shard(0)]; 2-d (replicate, shard) HSDP:
// [Replicate(), Shard(0)]), requires_grad kept, each rank holding its torch.chunk rows in one
// flat buffer padded to ceil(rows / shard size) rows per parameter. Forward pre-hook: one flat
// all-gather (in param_dtype) rebuilds plain unsharded leaf parameters (set_parameter) and
// issues the all-gathers of the next forward_prefetch_depth units; post-hook: frees them when
// reshard_after_forward (never for the root) and hooks the outputs' gradients so that the
// parameters are gathered again before the unit's backward (plus backward_prefetch_depth units
// in backward order). When all trainable unsharded parameters of a unit got their gradient
// (post-accumulate-grad hooks) their gradients are reduce-scattered as one flat buffer in
// reduce_dtype (async; HSDP adds an all_reduce over the replicate dim), averaged over the dp
// size and added into the sharded parameters' .grad (Shard(0) DTensors). As in FSDP2 at most
// one earlier reduction is in flight: before a unit packs its gradients, the previous unit's
// reduce-scatter is waited for, its input (the flat unsharded gradients) freed and its shards
// added into .grad (HSDP: its all_reduce issued, waited for and applied at the next unit), so a
// backward holds about two units' unsharded gradients, not every unit's. Frozen parameters are
// gathered but never reduced; a unit without trainable parameters issues no reduce-scatter.
// requires_grad changed after fully_shard is honoured from the unit's next forward (FSDP2):
// a parameter frozen later is no longer reduced (so the optimizer never moves it again), one
// unfrozen later is reduced from then on (FSDPParamGroup::sync_requires_grad).
//
// FSDP + TP is recognised from the parameters' own meshes, whatever the dims are named: when a
// parameter of the unit is already a DTensor (after parallelize_module), its 1-d mesh must be the
// last dim of `mesh` ("tp", "model", "ep", ...) and the dims before it are the dp dims ((shard)
// or HSDP (replicate, shard)); a unit of plain parameters whose descendant units use the same
// mesh that way (the root after its TP layers) is laid out alike, any other unit of plain
// parameters reads `mesh` as (shard) or (replicate, shard). PyTorch's call works too: `mesh`
// holds only the dp dims (mesh["dp"]) and the TP parameters live on another 1-d sub-mesh of the
// same constructed mesh (mesh["model"]); the unit then uses that mesh's (dp dims..., tp dim),
// and a unit of plain parameters stays on the dp mesh. Each parameter's
// TP-local tensor is split along dim 0 over dp_shard, so the sharded parameter is a DTensor on
// the whole mesh: [Shard(0), TP placement], or [StridedShard(0, tp), Shard(0)] when TP splits dim
// 0 too (colwise; rank (d, t) holds dp chunk d of TP block t, PyTorch's _StridedShard layout, so
// full_tensor and checkpoints see rows in order); plain parameters are [Shard(0), Replicate()].
// The all-gather over dp rebuilds the TP-local tensor (the module sees the TP DTensor again),
// the TP-local gradient is reduce-scattered over dp and averaged over the dp size only.
//
// Backward contract (FSDP2: the user calls nothing after backward()): the first FSDP hook that
// runs in a backward (a unit's pre-backward or a gradient-ready hook) queues the root's
// post-backward callback on the autograd engine (queue_callback, tensor/autograd/node.h). It
// runs once at the end of the outermost backward, after every node (an activation-checkpoint
// recomputation's nested backward does not run it): it reduces the units that received only part
// of their gradients (missing gradients count as zero; with requires_gradient_sync false it keeps
// them unsharded instead), waits for every reduction and in-flight all-gather and reshards every
// unit; a unit still unsharded then (the root, a unit whose frozen parameters waited for the end)
// keeps its frozen parameters gathered, and the next forward gathers only its other parameters
// while those shards are unchanged (FSDPParamGroup::reshard(keep_frozen); the module sees the
// sharded DTensors either way). So after loss.backward() the sharded .grad are final, also when
// some trainable parameter got no gradient. The state of a unit lives on its module (nn::Module::state, key
// "fully_shard"); a module given replicate too is refused. A unit that received no gradient at
// all on this rank issues no reduce-scatter (every rank must reach each unit's parameters).
#include "parallel/fsdp/fsdp_param_group.h"
#include "parallel/fsdp/mixed_precision.h"

namespace dtr {

/// Shards `module`'s unclaimed parameters over `mesh` (see the file comment).
/// Errors: fully_shard (or replicate) already applied to `module`, or replicate to a module
/// enclosing it (a parameter replicate manages); a parameter also registered in a module
/// outside this unit that an earlier unit claimed (tied weights across units; both FQNs named);
/// a DTensor parameter (TP) with a 1-d `mesh`, living on a dim of `mesh` that is not the last
/// ("tp last"), or on another mesh than the last dim ("mesh dims do not match"), or a Partial TP placement;
/// a 0-d or non-leaf parameter; parameters of one unit with different dtypes; a policy dtype
/// that is not f32/f64/bf16/f16; a mesh that is not 1-d or 2-d (2-d or 3-d when the unit is FSDP + TP); negative
/// prefetch depths; an enabled OffloadPolicy with a parameter not on the CPU (not built).
void fully_shard(nn::Module& module, const DeviceMesh& mesh, const FSDPOptions& options = {});

/// True when fully_shard was called on `module`.
bool is_fully_sharded(const nn::Module& module);

/// Gradient accumulation: with false, backward keeps the unsharded gradients (in reduce_dtype)
/// and issues no reduce-scatter until a backward with true. Applies to every unit in `module`'s
/// subtree. Errors: no unit in the subtree.
void set_requires_gradient_sync(nn::Module& module, bool requires_sync);

/// Pipeline parallelism: with false, the forward / backward hooks of every unit under `module`
/// do nothing and the caller drives the param groups (fsdp_param_group): the pipeline gathers
/// each unit once before a step's first micro-batch, keeps it unsharded through every forward
/// and backward (FSDP2's reshard_after_forward=False, as Automodel sets under PP), then reduces
/// the accumulated gradients and reshards (parallel/pipeline/stage_fsdp.h). Mixed-precision
/// input / output casts are hook work and do not run either. Errors: no unit in the subtree.
void set_fsdp_hooks_enabled(nn::Module& module, bool enabled);

/// The param group of a unit (tests and benchmarks read its layout); null when not sharded.
FSDPParamGroup* fsdp_param_group(const nn::Module& module);

/// Seconds this process spent blocked in waits on FSDP collectives (all-gather waits in the
/// pre-forward / pre-backward, reduction waits at the next unit's reduction and at the end of
/// backward) since the last reset:
/// the exposed (non-overlapped) communication time that benchmarks report.
double fsdp_exposed_comm_seconds();
void reset_fsdp_exposed_comm_seconds();
/// While on, each of those waits also appends its seconds to a log, in order. Every rank waits
/// for the same collectives in the same order, so benchmarks compare the logs across ranks: the
/// smallest wait of a collective over the ranks is the part not hidden even on the rank that
/// arrived last, the rest of a rank's wait is time spent waiting for a slower rank.
void set_fsdp_wait_log(bool on);
/// Returns the log and clears it.
std::vector<double> take_fsdp_wait_log();

}  // namespace dtr
