#pragma once
// GGUF v2/v3 reader (llama.cpp's model format). Layout (little-endian), from
// https://github.com/ggml-org/ggml/blob/master/docs/gguf.md:
//   u32 magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to general.alignment (default 32) | data section (offsets relative to its start)
// string = u64 length + bytes; array = u32 elem_type + u64 count + elems.
// ne[0] is the fastest-varying dim: a PyTorch [out, in] weight has ne = {in, out}.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "models/formats/gguf_types.h"
#include "models/formats/mapped_file.h"
#include "tensor/tensor.h"

namespace dtr::gguf {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint64_t kDefaultAlignment = 32;

/// GGUF metadata value types (enum gguf_type).
enum class ValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, bool_ = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};
const char* value_type_name(ValueType t);

/// One metadata value: a scalar, a string or an array (of scalars, strings or arrays).
struct Value {
  ValueType type = ValueType::u8;
  ValueType elem_type = ValueType::u8;  // arrays only
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<Value>> v;

  bool is_integer() const;
  bool is_float() const { return type == ValueType::f32 || type == ValueType::f64; }
  bool is_string() const { return type == ValueType::string; }
  bool is_array() const { return type == ValueType::array; }
  /// Any integer type as int64. Errors: not an integer, or a u64 above INT64_MAX.
  int64_t as_int() const;
  /// Floats and integers as double. Errors: other types.
  double as_float() const;
  bool as_bool() const;
  const std::string& as_string() const;
  const std::vector<Value>& as_array() const;
  /// Array helpers (each element converted as above).
  std::vector<std::string> as_string_array() const;
  std::vector<int64_t> as_int_array() const;
  std::vector<double> as_float_array() const;
  /// Short human-readable form (arrays: type and length, first few elements).
  std::string str() const;
};

/// Where a tensor lives in the file and what it holds.
struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;   // GGUF order, ne[0] fastest
  uint32_t type = 0;         // ggml type id
  uint64_t offset = 0;       // relative to the data section
  uint64_t nbytes = 0;
  /// PyTorch order shape (ne reversed), e.g. [out, in] for a weight.
  Shape shape() const { return Shape(ne.rbegin(), ne.rend()); }
  int64_t numel() const;
};

/// A parsed, validated GGUF file over a memory map.
class GGUFFile {
 public:
  /// Maps and parses `path`.
  /// Errors (dtr::Error naming the file, the offset and the key/tensor): bad magic, big-endian
  /// or unsupported version (only 2 and 3), absurd counts (more entries than bytes left),
  /// strings/arrays past the end, unknown value type, bad alignment, n_dims > 4, negative or
  /// overflowing dims, unknown tensor type, rows not a multiple of the block size, duplicate
  /// names, misaligned offsets, tensor data out of bounds.
  static GGUFFile open(const std::string& path);
  /// Parses an already mapped file (the same checks).
  static GGUFFile parse(std::shared_ptr<MappedFile> file);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  /// File offset of the data section.
  uint64_t data_offset() const { return data_offset_; }

  /// Metadata keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  /// Errors: a missing key -> dtr::Error naming the key and the file.
  const Value& get(const std::string& key) const;
  /// Typed lookups with a default for a missing key; a present key of the wrong type throws.
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_float(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  std::string get_string(const std::string& key, const std::string& def) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool has_tensor(const std::string& name) const { return tindex_.count(name) != 0; }
  /// Errors: no such tensor -> dtr::Error naming it and the file.
  const TensorInfo& tensor_info(const std::string& name) const;
  /// The packed bytes of a tensor inside the map.
  std::string_view raw(const std::string& name) const;
  /// All values of a tensor dequantised to f32, row-major in shape() order.
  std::vector<float> dequantize(const std::string& name) const;
  /// A CPU f32 tensor of shape() holding dequantize(name).
  Tensor load_f32(const std::string& name) const;

 private:
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::map<std::string, Value> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tindex_;
};

/// Dequantises `info`'s bytes (`raw.size()` must equal info.nbytes) to f32.
std::vector<float> dequantize(const TensorInfo& info, std::string_view raw, const std::string& context);

}  // namespace dtr::gguf
