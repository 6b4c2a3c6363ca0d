#pragma once
// Activation checkpointing: run a block without keeping its activations and recompute them
// in backward. Source: torch.utils.checkpoint (reentrant variant), with the RNG state saved
// at forward time restored for the recomputation so that dropout draws the same mask.
#include <functional>
#include <vector>

#include "tensor/random.h"
#include "tensor/tensor.h"

namespace dtr {

/// A checkpointed block: inputs -> outputs.
using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

/// The recompute node shared by checkpoint() and parallel/ checkpoint_module: `outs` (computed
/// under NoGradGuard, detached) become the outputs of one node whose backward re-runs `fn` on
/// detached copies of `inputs` with the generator set to `rng` and grad mode on, backpropagates
/// the output gradients through that graph (parameters used by `fn` get their .grad there) and
/// returns the inputs' gradients. `what` names the computation in errors (may be empty).
/// Errors (in backward): the recomputation returns a different number or shape of outputs.
void record_checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs, std::vector<Tensor>& outs,
                       GeneratorState rng, const std::string& what);

/// True while a checkpoint node's backward re-runs its forward on this thread (layers that must
/// not redo a decision of the forward, e.g. MoE routing, reuse what they kept).
bool checkpoint_recomputing();

/// Runs `fn(inputs)` under NoGradGuard and records one node "checkpoint" whose backward
/// re-runs `fn` with grad enabled on detached copies of the inputs (requires_grad as the
/// originals; the Philox generator state of the forward call restored for the re-run), runs
/// backward through the recomputed graph and returns the inputs' gradients. Parameters used
/// inside `fn` get their .grad accumulated (and their hooks fired) by that inner backward,
/// like PyTorch's reentrant checkpoint.
/// Unlike PyTorch's reentrant variant the node is recorded whenever grad mode is on, even if
/// no input requires grad, so parameters inside `fn` still get gradients (frozen embeddings
/// feeding trainable LoRA layers). Outputs are then marked requires_grad.
/// Errors: an input modified in place between forward and backward (saved-tensor check);
/// a second backward without retain_graph.
/// Shapes/dtypes: whatever `fn` returns; outputs never alias the autograd identity of inputs.
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

/// Single-output convenience: `fn` returns one tensor.
Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs);

}  // namespace dtr
