#pragma once
// safetensors reader / writer. Format (https://github.com/huggingface/safetensors):
//   u64 little-endian N | N bytes of JSON header | data section
// header: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
//          "data_offsets": [begin, end]}, ...}; offsets are relative to the data section.
// The parsing layer works on plain bytes; only SafetensorsFile::get / save_file touch
// dtr::Tensor.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "models/formats/mapped_file.h"
#include "tensor/tensor.h"

namespace dtr::safetensors {

/// Largest header accepted (the reference implementation uses the same 100 MB limit).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// One tensor of a safetensors header. `begin`/`end` are byte offsets into the data section.
struct TensorEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
  uint64_t nbytes() const { return end - begin; }
};

/// A parsed and validated header. `tensors` is sorted by `begin`.
struct Header {
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + N: file offset of the data section
};

/// safetensors dtype string ("F32", "BF16", ...) of a dtr dtype.
const char* dtype_to_string(DType t);
/// dtr dtype of a safetensors dtype string. Supported: F64 F32 F16 BF16 I64 I32 U8 BOOL.
/// Errors: anything else -> dtr::Error naming the string and `context` (file and key).
DType dtype_from_string(const std::string& s, const std::string& context);

/// Parses and validates the header of a whole safetensors file held in `bytes`.
/// Checks: 8-byte length present, N <= kMaxHeaderBytes, 8 + N <= file size, JSON object,
/// each entry has a known dtype, non-negative shape whose byte size does not overflow and
/// equals end - begin, begin <= end <= data size, no two tensors overlap.
/// Errors: dtr::Error naming `file` and the offset or key at fault.
Header parse_header(std::string_view bytes, const std::string& file);

/// A tensor to write as raw contiguous little-endian bytes.
struct RawTensor {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

/// The JSON header for `tensors` laid out back to back in the given order, padded with spaces
/// to a multiple of 8 bytes (so the data section is 8-byte aligned), without the length prefix.
/// Errors: duplicate names, nbytes != numel * itemsize, the name "__metadata__".
std::string make_header(const std::vector<RawTensor>& tensors,
                        const std::map<std::string, std::string>& metadata);

/// Writes a safetensors file atomically (temp file + rename). Tensors are laid out in the
/// order given. Errors: see make_header; I/O errors name the path.
void write_raw(const std::string& path, const std::vector<RawTensor>& tensors,
               const std::map<std::string, std::string>& metadata = {});

/// How get() materialises a tensor: `copy` into a fresh CPU tensor (default, writable), or a
/// read-only `view` over the memory map (no copy; the map stays alive as long as the tensor;
/// writing into it crashes). Misaligned data (offset not a multiple of the item size) is
/// always copied.
enum class LoadMode { copy, view };

/// An open, memory-mapped, validated safetensors file.
class SafetensorsFile {
 public:
  /// Maps and validates `path`. Errors: see parse_header; open/mmap failures.
  static SafetensorsFile open(const std::string& path);
  const std::string& path() const { return file_->path(); }
  const Header& header() const { return header_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  /// Tensor names in data order.
  std::vector<std::string> keys() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  /// Header entry of `name`. Errors: unknown name -> dtr::Error naming file and key.
  const TensorEntry& entry(const std::string& name) const;
  /// The raw bytes of `name` inside the map.
  std::string_view raw(const std::string& name) const;
  /// `name` as a CPU tensor with the file's shape and dtype, bit-exact.
  Tensor get(const std::string& name, LoadMode mode = LoadMode::copy) const;

 private:
  std::shared_ptr<MappedFile> file_;
  Header header_;
  std::map<std::string, size_t> index_;
};

/// Name -> tensor, sorted by name.
using TensorMap = std::map<std::string, Tensor>;

/// Loads every tensor of a safetensors file.
TensorMap load_file(const std::string& path, LoadMode mode = LoadMode::copy);

/// Saves tensors (any device, any strides: made contiguous CPU first) to one safetensors file,
/// atomically. Layout: sorted by item size (largest first) then name, like the reference
/// writer, so every tensor is aligned to its item size.
/// Errors: undefined or distributed tensors (pass full_tensor()), I/O errors.
void save_file(const TensorMap& tensors, const std::string& path,
               const std::map<std::string, std::string>& metadata = {});

}  // namespace dtr::safetensors
