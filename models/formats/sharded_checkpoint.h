#pragma once
// Sharded safetensors checkpoints in the Hugging Face layout:
//   <dir>/model-00001-of-00003.safetensors ... + <dir>/model.safetensors.index.json
//   index: {"metadata": {"total_size": <bytes>}, "weight_map": {"<tensor>": "<shard file>"}}
// A checkpoint that fits one shard is written as <dir>/model.safetensors without an index.
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "models/formats/safetensors.h"

namespace dtr::safetensors {

/// Contents of a model.safetensors.index.json.
struct ShardIndex {
  uint64_t total_size = 0;                         // metadata.total_size: sum of tensor bytes
  std::map<std::string, std::string> weight_map;   // tensor name -> shard file name (relative)
};

/// Reads an index file. Errors: missing file, JSON error, missing "weight_map", non-string
/// entries, shard names with a '/' (no path escapes) -> dtr::Error naming the file and key.
ShardIndex read_index(const std::string& path);
/// Writes an index file atomically.
void write_index(const ShardIndex& index, const std::string& path);

/// Default shard size of save_sharded (Hugging Face's save_pretrained uses 5 GB).
constexpr uint64_t kDefaultMaxShardBytes = 5ull << 30;

/// Saves `tensors` into directory `dir` (created if missing) as shards of at most
/// `max_shard_bytes` each (a tensor larger than that gets a shard of its own), in name order:
/// "<prefix>-0000i-of-0000n.safetensors" + "<prefix>.safetensors.index.json", or a single
/// "<prefix>.safetensors" when everything fits one shard. Every file is written atomically;
/// the index is written last. `metadata` goes into every shard's __metadata__.
/// Returns the paths written (shards, then the index if any).
std::vector<std::string> save_sharded(const TensorMap& tensors, const std::string& dir,
                                      uint64_t max_shard_bytes = kDefaultMaxShardBytes,
                                      const std::map<std::string, std::string>& metadata = {},
                                      const std::string& prefix = "model");

/// Loads a checkpoint from: a directory (its "model.safetensors.index.json" or
/// "model.safetensors"), an index json file, or one .safetensors file.
/// Errors: nothing to load; an index naming a tensor its shard lacks, or a shard holding a
/// tensor the index does not list -> dtr::Error naming shard and tensor.
TensorMap load_checkpoint(const std::string& path, LoadMode mode = LoadMode::copy);

/// The tensors of a checkpoint (same paths and checks as load_checkpoint) without reading them:
/// tensor name -> its open, mapped file (shared by the names it holds).
std::map<std::string, std::shared_ptr<const SafetensorsFile>> open_checkpoint(const std::string& path);

}  // namespace dtr::safetensors
