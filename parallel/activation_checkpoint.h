#pragma once
// Activation checkpointing of whole modules (full AC): the module's forward runs without
// saving activations and is recomputed in backward. Source: torch.utils.checkpoint (reentrant)
// + torch.distributed.algorithms._checkpoint.checkpoint_wrapper, applied without a wrapper
// module so that FQNs stay unchanged.
#include <functional>
#include <string>

#include "tensor/nn/module.h"

namespace dtr {

/// Checkpoints `module`: a forward pre-hook turns grad mode off and records the inputs and the
/// Philox generator state; a forward hook turns it back on and records one autograd node
/// "checkpoint" over the inputs whose backward re-runs module.forward_list (grad on, generator
/// state restored so dropout draws the same mask), back-propagates through the recomputation
/// and returns the inputs' gradients. Parameters get their .grad (and post-accumulate hooks)
/// from that inner backward, as with torch's reentrant checkpoint. The node is recorded
/// whenever grad mode is on, even if no input requires grad (frozen embeddings feeding
/// trainable layers). Hooks of the module itself are not re-run by the recomputation.
/// Order: apply before fully_shard on the same module (its hooks must see the checkpointed
/// outputs), as NeMo Automodel's parallelizer does.
/// Errors: module already checkpointed; fully_shard already applied to it.
void checkpoint_module(nn::Module& module);

/// Applies checkpoint_module to every descendant of `root` (pre-order, FQN relative to root)
/// for which `pred(fqn, module)` is true; returns how many were wrapped.
int apply_activation_checkpointing(nn::Module& root,
                                   const std::function<bool(const std::string&, nn::Module&)>& pred);

/// True when checkpoint_module was applied to `module`.
bool is_checkpointed(const nn::Module& module);

}  // namespace dtr
