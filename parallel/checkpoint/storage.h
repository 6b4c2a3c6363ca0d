#pragma once
// Where a distributed checkpoint goes: the StorageWriter / StorageReader interfaces of
// save_state_dict / load_state_dict (PyTorch torch.distributed.checkpoint.storage). The
// file-system implementation (one safetensors file per rank + metadata.json, committed by a
// directory rename) is models/formats/dcp_filesystem.h; a test can implement them in memory.
#include <string>
#include <vector>

#include "parallel/checkpoint/metadata.h"
#include "tensor/tensor.h"

namespace dtr::dcp {

/// One chunk a rank writes: `tensor` (contiguous, on the CPU) holds the elements
/// [offsets, offsets + tensor.sizes()) of the global tensor `key`.
struct WriteItem {
  std::string key;
  Tensor tensor;
  Shape offsets;
};

/// Writes one checkpoint. save_state_dict calls, on every rank of the group, in this order:
/// set_up, storage_name, write_data, then finish on rank 0 (the coordinator) after every
/// rank's write_data returned. Any exception is reported on every rank (see save_state_dict).
class StorageWriter {
 public:
  virtual ~StorageWriter() = default;
  /// Prepares the (temporary) location; `is_coordinator` is rank 0, which creates it while
  /// the others wait (a barrier follows).
  virtual void set_up(bool is_coordinator) = 0;
  /// The name of the storage item `rank` writes (recorded in ChunkMetadata::storage).
  virtual std::string storage_name(int rank) const = 0;
  /// Writes this rank's chunks (possibly none) into storage_name(rank).
  virtual void write_data(int rank, const std::vector<WriteItem>& items) = 0;
  /// Coordinator only: writes `md` and makes the checkpoint visible in one step (a reader
  /// sees the previous checkpoint or the whole new one, never a part).
  virtual void finish(const Metadata& md) = 0;
};

/// Reads one checkpoint.
class StorageReader {
 public:
  virtual ~StorageReader() = default;
  /// What the checkpoint is, for messages (e.g. its directory).
  virtual std::string location() const = 0;
  /// The checkpoint's metadata. Errors: missing or damaged metadata, naming it.
  virtual Metadata read_metadata() = 0;
  /// Chunk `c` of tensor `key` (metadata `t`) as a CPU tensor of shape c.sizes and dtype
  /// t.dtype (may be a read-only view). Errors: the storage item missing or truncated, the key
  /// absent from it or of another shape / dtype -> dtr::Error naming the item and the key.
  virtual Tensor read_chunk(const std::string& key, const TensorMetadata& t, const ChunkMetadata& c) = 0;
  /// Checks that the checkpoint is complete (every storage item there, holding each chunk
  /// with its shape and dtype) without reading tensor data; the default reads the metadata.
  /// Errors: as read_metadata / read_chunk.
  virtual void check() { read_metadata(); }
};

}  // namespace dtr::dcp
