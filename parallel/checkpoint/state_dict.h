#pragma once
// Distributed checkpoint of a state dict (PyTorch torch.distributed.checkpoint save /
// load): every rank writes the local chunks of its tensors (a DTensor's local shard at its
// global offset, a plain tensor whole), rank 0 writes the metadata (global shape, dtype, every
// chunk's offsets / sizes and storage item); loading fills each destination tensor's local
// block from the saved chunks that overlap it, so a checkpoint saved on one mesh / placement /
// world size loads on any other (parallel/checkpoint/reshard.h). Storage: storage.h.
#include <map>
#include <string>

#include "parallel/checkpoint/metadata.h"
#include "parallel/checkpoint/storage.h"
#include "runtime/process_group.h"
#include "tensor/tensor.h"

namespace dtr::dcp {

/// Key -> plain tensor or DTensor (e.g. "model/<fqn>", "optim/exp_avg/<fqn>").
using StateDict = std::map<std::string, Tensor>;

/// Saves `sd` through `writer`, collective over `pg` (every rank calls it; keys may differ
/// between ranks, e.g. pipeline stages, and their union is saved). A chunk held by several
/// ranks (a replicated tensor or mesh dim) is written once, by the lowest rank holding it
/// (PyTorch's dedup_save_plans). `extra` is stored verbatim in the metadata.
/// Errors (raised on every rank with the same message, the first failing rank's, so that no
/// rank waits for another): undefined or Partial tensors, the same key with another global
/// shape or dtype on two ranks, any storage error; the writer then commits nothing.
void save_state_dict(const StateDict& sd, StorageWriter& writer, ProcessGroup& pg,
                     const nlohmann::json& extra = nlohmann::json::object());

/// Loads every tensor of `sd` in place from `reader` (each rank its local block; not
/// collective). dtypes must match the saved ones (no silent conversion).
/// Errors: a key not in the checkpoint, a global shape or dtype that differs, elements of a
/// local block that no saved chunk covers, storage errors -> dtr::Error naming the key, the
/// checkpoint (reader.location()) and what was expected. Returns the metadata (its `extra`).
Metadata load_state_dict(const StateDict& sd, StorageReader& reader);

}  // namespace dtr::dcp
