#pragma once
// dtr-train's training checkpoints: what is saved and where; the sharded save, the commit
// protocol and the reshard on load are the distributed checkpoint's
// (parallel/checkpoint/state_dict.h, file-system storage models/formats/dcp_filesystem.h).
//
// <root>/step_<N>/ (N = optimizer steps done) holds the state dict
//   "model/<fqn>"            every trainable parameter (plain or DTensor, its own layout)
//   "optim/<k>/<fqn>"        its optimizer state (AdamW exp_avg / exp_avg_sq) in the same layout
//   "optim/step/<fqn>"       its optimizer step, a 1-element i64 tensor
// and, as the metadata's "extra", the sampler state, RNG state, LR step, mesh and recipe.
// Files: rank_<r>.safetensors (each rank's chunks) + metadata.json, written into
// <root>/.tmp_step_<N> and renamed, so a directory step_<N> holding metadata.json is complete;
// leftovers of a killed save are removed at the next save. Checkpoints written before the
// distributed checkpoint (per-file "dtr_shards" block maps) still load (checkpoint_legacy.h).
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/process_group.h"
#include "tensor/optim/optimizer.h"
#include "tensor/tensor.h"

namespace dtr::train {

using NamedParams = std::vector<std::pair<std::string, Tensor>>;

/// Writes step_<step> under `root` (collective over `world`): see the file comment.
/// `params` are the trainable parameters (plain or distributed), `opt` holds their state.
/// keep_last > 0: rank 0 then deletes the oldest complete checkpoints beyond that number.
/// Errors (AllRanksError, on every rank): a NaN / Inf parameter (nothing written; the message
/// names the lowest rank holding one and its first such parameter), I/O errors
/// naming the path (the earlier checkpoints stay).
void save_checkpoint(const std::string& root, int64_t step, const NamedParams& params, optim::Optimizer& opt,
                     const nlohmann::json& extra, int64_t keep_last, ProcessGroup& world);

/// The newest complete checkpoint directory under `root` (highest N of step_<N> holding a
/// metadata.json), or nullopt.
std::optional<std::string> find_latest_checkpoint(const std::string& root);
/// Every complete checkpoint directory under `root`, newest first.
std::vector<std::string> checkpoints_newest_first(const std::string& root);

/// Reads <dir>/metadata.json and checks every field the loader and dtr-train use (the storage's:
/// format, world_size, state_dict chunks; dtr-train's: extra.step / lr_step / sampler /
/// rng.seed / rng.offset) and its type.
/// Errors: one dtr::Error naming the file and the field.
nlohmann::json read_checkpoint_metadata(const std::string& dir);

/// "" when `dir` looks loadable (metadata as above; every listed shard file exists, opens as
/// safetensors and holds the chunks metadata.json lists), else what is wrong, naming the file.
std::string checkpoint_problem(const std::string& dir);

/// Loads the local shards of `params` and of their optimizer state from checkpoint `dir`
/// (reassembling from every shard file, any mesh), and returns the metadata's "extra".
/// Errors: a parameter missing from the checkpoint, a global shape that differs, a region
/// of a local block that no shard covers -> dtr::Error naming the fqn and the directory.
nlohmann::json load_checkpoint(const std::string& dir, const NamedParams& params, optim::Optimizer& opt);

}  // namespace dtr::train
