#pragma once
// The file-system storage of the distributed checkpoint (parallel/checkpoint/storage.h;
// PyTorch's FileSystemWriter / FileSystemReader), in safetensors:
//   <path>/rank_<r>.safetensors  rank r's chunks, each under its state-dict key (a chunk held
//                                by several ranks is in the lowest rank's file only)
//   <path>/metadata.json         rank 0: dcp::to_json(metadata) (global shapes, dtypes, every
//                                chunk's offset / shape / file, the caller's "extra") plus
//                                "format": "dtr-dcp/1" and "files": every rank file
// Atomic: everything goes into <parent>/.tmp_<name> (every file fsync'ed); finish() moves an
// existing <path> aside, renames the temp directory to <path>, fsyncs <parent> and only then
// removes the old one, so a failure at any point leaves the previous checkpoint readable and a
// directory holding metadata.json complete.
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "models/formats/safetensors.h"
#include "parallel/checkpoint/storage.h"

namespace dtr::dcp {

/// Writes a checkpoint directory `path` (see the file comment).
class FileSystemWriter : public StorageWriter {
 public:
  explicit FileSystemWriter(std::string path);
  /// Coordinator: creates the parent directory and an empty temp directory (removing a stale
  /// one of the same name). Errors: I/O, naming the directory.
  void set_up(bool is_coordinator) override;
  /// "rank_<r>.safetensors".
  std::string storage_name(int rank) const override;
  /// Writes rank_<rank>.safetensors into the temp directory. Errors: I/O, naming the file.
  void write_data(int rank, const std::vector<WriteItem>& items) override;
  /// Writes metadata.json and commits (see the file comment). Errors: I/O, naming the path.
  void finish(const Metadata& md) override;
  /// The temp directory the files go to before finish().
  std::string temp_path() const;

 private:
  std::string path_;
};

/// Reads a checkpoint directory `path` written by FileSystemWriter.
class FileSystemReader : public StorageReader {
 public:
  explicit FileSystemReader(std::string path);
  std::string location() const override { return path_; }
  /// Parses metadata.json (read_metadata_json, then dcp::metadata_from_json).
  Metadata read_metadata() override;
  /// The chunk from its rank file (a read-only view of the mapped file). Errors: the file
  /// missing or truncated, the key absent, another shape / dtype -> naming file and key.
  Tensor read_chunk(const std::string& key, const TensorMetadata& t, const ChunkMetadata& c) override;
  /// Opens every file that metadata.json lists and checks that each chunk is there with its
  /// shape and dtype, reading no tensor data. Errors: as read_chunk, and read_metadata's.
  void check() override;

 private:
  const safetensors::SafetensorsFile& file(const std::string& name);
  /// The file of chunk `c` after checking that it holds `key` with the chunk's shape and dtype.
  const safetensors::SafetensorsFile& chunk_file(const std::string& key, const TensorMetadata& t, const ChunkMetadata& c);
  std::string path_;
  std::map<std::string, std::shared_ptr<safetensors::SafetensorsFile>> files_;
};

/// <dir>/metadata.json parsed. Errors: unreadable / not JSON / not an object -> dtr::Error
/// "checkpoint: '<file>' ..." naming the file.
nlohmann::json read_metadata_json(const std::string& dir);

}  // namespace dtr::dcp
