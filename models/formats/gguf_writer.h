#pragma once
// A small GGUF v3 writer: metadata of every value type and tensors given as packed bytes of
// any registered ggml type. Used by tests (synthetic files) and by dtr-convert.
#include <cstdint>
#include <string>
#include <vector>

#include "models/formats/gguf.h"

namespace dtr::gguf {

/// Value constructors for GGUFWriter::add.
Value make_value(ValueType t, uint64_t u);  // u8 u16 u32 u64
Value make_int(ValueType t, int64_t i);     // i8 i16 i32 i64
Value make_float(ValueType t, double d);    // f32 f64
Value make_bool(bool b);
Value make_string(std::string s);
Value make_array(ValueType elem_type, std::vector<Value> elems);
Value make_string_array(const std::vector<std::string>& s);
Value make_i32_array(const std::vector<int32_t>& v);
Value make_f32_array(const std::vector<float>& v);

/// Builds a GGUF file in memory. Keys and tensors are written in insertion order; tensor data
/// is placed back to back, each aligned to `alignment` (written as general.alignment when it
/// is not the default 32).
class GGUFWriter {
 public:
  explicit GGUFWriter(uint32_t version = 3, uint64_t alignment = kDefaultAlignment);
  void add(const std::string& key, Value v);
  void add_u32(const std::string& key, uint32_t v) { add(key, make_value(ValueType::u32, v)); }
  void add_f32(const std::string& key, float v) { add(key, make_float(ValueType::f32, v)); }
  void add_bool(const std::string& key, bool v) { add(key, make_bool(v)); }
  void add_string(const std::string& key, std::string v) { add(key, make_string(std::move(v))); }
  /// A tensor of ggml type `type` with GGUF dims `ne` (ne[0] fastest) and its packed bytes.
  /// Errors: bytes.size() does not match ne and the type's block layout.
  void add_tensor(const std::string& name, const std::vector<int64_t>& ne, uint32_t type, std::string bytes);
  /// An f32 tensor of PyTorch shape `shape` (stored as F32, or F16 / BF16 when `as` says so).
  void add_f32_tensor(const std::string& name, const Shape& shape, const std::vector<float>& values,
                      GGMLType as = GGMLType::F32);
  /// The whole file.
  std::string bytes() const;
  /// Writes the file atomically (streamed: the tensors are not copied again).
  void write(const std::string& path) const;

 private:
  /// Everything before the data section (header, metadata, tensor infos, padding).
  std::string header_bytes() const;
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> ne;
    uint32_t type;
    std::string data;
  };
  uint32_t version_;
  uint64_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace dtr::gguf
