#pragma once
// dtr-train checkpoints written before the distributed checkpoint moved to parallel/checkpoint
// (metadata.json without "format"; every rank_<r>.safetensors carries __metadata__
// "dtr_shards" = {fqn: {"offset", "global_shape", "step"}} shared by "model/<fqn>" and
// "optim/<k>/<fqn>"), read as a dcp::StorageReader so that they still resume: each tensor of
// each file is a chunk at its parameter's offset, and the AdamW step of <fqn> (the largest
// over the files) is the 1-element i64 chunk "optim/step/<fqn>" of the current layout.
#include <map>
#include <memory>
#include <string>

#include "models/formats/safetensors.h"
#include "parallel/checkpoint/storage.h"

namespace dtr::train {

/// True when `meta` (a parsed metadata.json) is of the layout above.
bool is_legacy_checkpoint(const nlohmann::json& meta);

/// Reads checkpoint directory `dir` of the layout above.
class LegacyCheckpointReader : public dcp::StorageReader {
 public:
  explicit LegacyCheckpointReader(std::string dir);
  std::string location() const override { return dir_; }
  /// Built from metadata.json ("files", "world_size", "extra") and every file's dtr_shards.
  /// Errors: a file missing, truncated or without dtr_shards, a tensor of a parameter that
  /// dtr_shards does not list, a mistyped dtr_shards field (offset, global_shape: lists of
  /// non-negative integers; step: an integer), a chunk outside its global shape or of another
  /// rank, files that disagree on a tensor's global shape or dtype -> one dtr::Error naming the
  /// file and the field or tensor.
  dcp::Metadata read_metadata() override;
  Tensor read_chunk(const std::string& key, const dcp::TensorMetadata& t, const dcp::ChunkMetadata& c) override;
  /// read_metadata (it opens every file and reads its header).
  void check() override { read_metadata(); }

 private:
  std::string dir_;
  std::map<std::string, std::shared_ptr<safetensors::SafetensorsFile>> files_;
  std::map<std::string, int64_t> steps_;  // "optim/step/<fqn>" -> AdamW step
};

}  // namespace dtr::train
