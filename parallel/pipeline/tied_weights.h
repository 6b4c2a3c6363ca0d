#pragma once
// Weights tied across pipeline stages (a causal LM's input embedding in the first stage and its
// output projection in the last, tie_word_embeddings): each of the two ranks holds its own copy,
// both start equal, and after every backward their gradients are summed between the two ranks,
// so the optimizer moves both copies alike and they stay equal, as the one shared tensor does
// without pipelining. Source: Megatron-LM's embedding group (_allreduce_word_embedding_grads).
#include <memory>

#include "runtime/process_group.h"

namespace dtr {

/// Adds the peer's gradient of its copy of the tied weight into `param`'s .grad (in place, the
/// local shard when distributed) and vice versa: one exchange with pp group rank `peer`. A
/// missing gradient counts as zeros. Both ranks must call it with the same shapes; with
/// peer == this rank (both stages on one rank: one tensor) or a frozen `param` (both copies are
/// frozen alike) nothing happens and no .grad is created. Errors: shapes or
/// layouts that differ between the two copies (the message names both).
void sum_tied_gradients(ProcessGroup& pp_group, const Tensor& param, int peer);

}  // namespace dtr
