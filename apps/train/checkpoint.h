#pragma once
// Sharded, atomic training checkpoints of dtr-train.
//
// Layout of <root>/step_<N>/ (N = optimizer steps done):
//   rank_<r>.safetensors  every rank: its local shards of the trainable parameters
//                         ("model/<fqn>") and of their AdamW state ("optim/exp_avg/<fqn>",
//                         "optim/exp_avg_sq/<fqn>"); __metadata__ "dtr_shards" = JSON
//                         {fqn: {"offset": [...], "global_shape": [...], "step": n}} giving
//                         where the local block sits in the global tensor.
//   metadata.json         rank 0: step, world size, mesh, per parameter global shape /
//                         placements / mesh shape, the list of shard files and `extra`
//                         (sampler state, RNG state, LR step, recipe).
// Atomicity: everything is written into <root>/.tmp_step_<N> (every file fsync'ed), all
// ranks meet at a barrier, then rank 0 renames it to step_<N>, fsyncs <root> and a second
// barrier follows. A directory named
// step_<N> is therefore complete; a job killed mid-write leaves only a .tmp_ directory,
// removed at the next save. Loading reassembles each local block from the overlapping blocks
// of every shard file (their offsets), so a checkpoint saved on one mesh loads on another.
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
/// Errors: I/O errors naming the path.
void save_checkpoint(const std::string& root, int64_t step, const NamedParams& params, optim::Optimizer& opt,
                     const nlohmann::json& extra, int64_t keep_last, ProcessGroup& world);

/// The newest complete checkpoint directory under `root` (highest N of step_<N> holding a
/// metadata.json), or nullopt.
std::optional<std::string> find_latest_checkpoint(const std::string& root);
/// Every complete checkpoint directory under `root`, newest first.
std::vector<std::string> checkpoints_newest_first(const std::string& root);

/// Reads <dir>/metadata.json and checks every field the loader and dtr-train use (step, files,
/// params.*.global_shape, extra.step / lr_step / sampler / rng.seed / rng.offset) and its type.
/// Errors: one dtr::Error naming the file and the field.
nlohmann::json read_checkpoint_metadata(const std::string& dir);

/// "" when `dir` looks loadable (metadata as above; every listed shard file exists, opens as
/// safetensors and carries its dtr_shards block map), else what is wrong, naming the file.
std::string checkpoint_problem(const std::string& dir);

/// Loads the local shards of `params` and of their optimizer state from checkpoint `dir`
/// (reassembling from every shard file, any mesh), and returns the metadata's "extra".
/// Errors: a parameter missing from the checkpoint, a global shape that differs, a region
/// of a local block that no shard covers -> dtr::Error naming the fqn and the directory.
nlohmann::json load_checkpoint(const std::string& dir, const NamedParams& params, optim::Optimizer& opt);

}  // namespace dtr::train
