#pragma once
// Activation checkpointing of whole modules (full AC): the module's forward runs without
// saving activations and is recomputed in backward. Source: torch.utils.checkpoint (reentrant)
// + torch.distributed.algorithms._checkpoint.checkpoint_wrapper, applied without a wrapper
// module so that FQNs stay unchanged.
#include <functional>
#include <string>
#include <vector>

#include "tensor/nn/module.h"

namespace dtr {

/// What a checkpointed module keeps from its forward.
/// - full: nothing but its inputs; backward re-runs the whole forward.
/// - selective: also the outputs of the ops on the save list (selective_ac_save_list(): matrix
///   products and attention); backward re-runs the forward but those ops return their saved
///   outputs instead of recomputing them, so only cheap ops (pointwise, norms, RoPE, softmax,
///   casts, views) are recomputed. Source: torchtitan's selective "op" activation checkpointing
///   (torch.utils.checkpoint with a SAC policy: save mm / linear / bmm / sdpa), which saves every
///   listed op (torchtitan recomputes every other mm; dtr keeps all).
enum class CheckpointPolicy { full, selective };

/// Parses "full" / "selective" (the recipe's distributed.activation_checkpointing).
/// Errors: anything else (names the value).
CheckpointPolicy checkpoint_policy_from_name(const std::string& name);
/// "full" / "selective".
const char* checkpoint_policy_name(CheckpointPolicy policy);

/// Op names whose outputs the selective policy saves: mm, bmm, sdpa.
const std::vector<std::string>& selective_ac_save_list();

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
/// Selective policy: while the forward runs, a DispatchMode keeps the outputs of the save-list
/// ops (in call order, version-checked); the recomputation replays them in the same order (an
/// op sequence that differs is an error naming the op).
/// The state lives on the module (nn::Module::state, key "checkpoint").
/// Errors: module already checkpointed; fully_shard already applied to it.
void checkpoint_module(nn::Module& module, CheckpointPolicy policy = CheckpointPolicy::full);

/// Applies checkpoint_module to every descendant of `root` (pre-order, FQN relative to root)
/// for which `pred(fqn, module)` is true; returns how many were wrapped.
int apply_activation_checkpointing(nn::Module& root,
                                   const std::function<bool(const std::string&, nn::Module&)>& pred,
                                   CheckpointPolicy policy = CheckpointPolicy::full);

/// True when checkpoint_module was applied to `module`.
bool is_checkpointed(const nn::Module& module);

}  // namespace dtr
