#pragma once
// The registry of ggml tensor types found in GGUF files: type id -> name, block size, bytes
// per block and a dequantise-to-f32 function. Block layouts follow ggml (ggml-common.h /
// ggml-quants.c, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md); the code here is
// written from those specifications.
#include <cstdint>
#include <string>
#include <vector>

namespace dtr::gguf {

/// ggml type ids (enum ggml_type). Only ids listed in the registry can be loaded.
enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

/// Dequantises `n` values (a multiple of the block size) from packed blocks at `src` to f32.
using DequantizeFn = void (*)(const uint8_t* src, float* dst, int64_t n);

/// One registry entry.
struct TypeTraits {
  uint32_t id;
  const char* name;        // "Q4_1"
  int64_t block_size;      // values per block (1 for plain types)
  int64_t type_size;       // bytes per block
  DequantizeFn dequantize; // to f32
};

/// The entry of type `id`, or nullptr when dtr does not know (or cannot dequantise) it.
const TypeTraits* find_type(uint32_t id);
/// The entry of type `id`. Errors: unknown id -> dtr::Error naming the id and `context`.
const TypeTraits& type_traits(uint32_t id, const std::string& context);
/// All registered types (for messages and tests).
const std::vector<TypeTraits>& all_types();

/// Bytes of a row of `n` values of type `t`. Errors: n not a multiple of the block size.
int64_t row_bytes(const TypeTraits& t, int64_t n, const std::string& context);

// Block sizes of the quantised formats (ggml QK4_0, QK8_0, QK_K).
constexpr int64_t kQK = 32;
constexpr int64_t kQK_K = 256;

}  // namespace dtr::gguf
