#pragma once
// Element types of dtr tensors and the 16-bit float formats (bf16, IEEE f16).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <type_traits>

namespace dtr {

/// Element type of a tensor. u8 and bool share the byte layout; bool holds 0 or 1.
enum class DType : uint8_t { f64, f32, bf16, f16, i64, i32, u8, bool_ };

/// Bytes per element.
size_t itemsize(DType t);
/// PyTorch-style name: "float32", "bfloat16", ...
const char* dtype_name(DType t);
/// Parses "float32" / "f32" / "bf16" / ...; throws dtr::Error naming the string otherwise.
DType dtype_from_name(const std::string& s);
/// True for f64, f32, bf16, f16.
bool is_floating(DType t);
/// True for bf16, f16 (computed in f32 on CPU).
inline bool is_low_precision(DType t) { return t == DType::bf16 || t == DType::f16; }
std::ostream& operator<<(std::ostream& os, DType t);

/// bfloat16: the upper 16 bits of an IEEE f32; conversion rounds to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a quiet NaN
      bits = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

/// IEEE 754 binary16; conversion rounds to nearest even, handles subnormals, inf and NaN.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(float_to_half(f)) {}
  operator float() const { return half_to_float(bits); }
  static uint16_t float_to_half(float f);
  static float half_to_float(uint16_t h);
};

/// Maps a C++ element type to its DType.
template <class T> struct dtype_of;
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::bool_; };

/// Element conversion between the storage types (double, float, bf16, f16) and a math type C
/// (float or double), through float for the 16-bit types: elem::load<C>(x) widens,
/// elem::store<T>(c) rounds to the storage type (round to nearest even for bf16 / f16). A nested
/// namespace, so that argument-dependent lookup on bf16 / f16 never finds them.
namespace elem {
template <class C, class T>
inline C load(const T& v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return static_cast<C>(static_cast<float>(v));
  else return static_cast<C>(v);
}
template <class T, class C>
inline T store(C v) {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}
}  // namespace elem

}  // namespace dtr
