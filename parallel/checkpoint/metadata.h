#pragma once
// Metadata of a distributed checkpoint (PyTorch torch.distributed.checkpoint.metadata): for
// every state-dict key the global shape, the dtype and the saved chunks (global offsets,
// sizes and the storage item holding each), plus the caller's own JSON (`extra`, for
// non-tensor state: step counters, sampler and RNG state). The storage writes it as JSON
// (to_json / metadata_from_json below) next to the chunk data.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace dtr::dcp {

/// One saved chunk of a tensor: elements [offsets, offsets + sizes) of the global tensor,
/// stored in `storage` (e.g. "rank_1.safetensors") under the tensor's key.
/// Source: PyTorch ChunkStorageMetadata (offsets, sizes) + MetadataIndex -> storage_data.
struct ChunkMetadata {
  Shape offsets;
  Shape sizes;
  std::string storage;
};

/// A saved tensor: global shape, dtype, the layout it had when saved (placements as
/// placements_str, mesh shape; "[]" / {} for a plain tensor; informational only, loading
/// reshards to whatever the destination has) and its chunks (sorted by rank, no duplicates).
struct TensorMetadata {
  DType dtype = DType::f32;
  Shape size;
  std::string placements = "[]";
  Shape mesh_shape;
  std::vector<ChunkMetadata> chunks;
};

/// A whole checkpoint.
struct Metadata {
  std::map<std::string, TensorMetadata> state_dict_metadata;
  int world_size = 0;                              // ranks that saved it
  nlohmann::json extra = nlohmann::json::object();  // the caller's non-tensor state
};

/// Metadata as JSON: {"world_size": N, "state_dict": {key: {"dtype": "float32",
/// "global_shape": [...], "placements": "...", "mesh_shape": [...], "chunks": [{"storage":
/// ..., "offset": [...], "shape": [...]}]}}, "extra": {...}}. dtype names are dtype_name()'s.
nlohmann::json to_json(const Metadata& md);

/// The list of non-negative integers at j[field] (a global shape, a chunk's offsets or sizes);
/// `path` names j in errors. Errors: "<where>: field '<path>.<field>' is missing or not a list"
/// or "... must hold non-negative integers, got <value>".
Shape shape_from_json(const nlohmann::json& j, const char* field, const std::string& path, const std::string& where);

/// Checks that chunk `c` of `key` lies inside the global shape `t.size`: the same rank, and
/// offsets + sizes <= size in every dim. Errors: one dtr::Error "<where>: a chunk of '<key>' ..."
/// naming its offset, its shape and the global shape.
void check_chunk(const std::string& key, const TensorMetadata& t, const ChunkMetadata& c, const std::string& where);

/// Parses to_json's layout. Errors: a missing or mistyped field, a chunk whose offset / shape
/// rank differs from the tensor's or that lies outside the global shape -> one dtr::Error
/// "<where>: field '<path>' ..." naming the key.
Metadata metadata_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace dtr::dcp
