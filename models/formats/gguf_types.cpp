#include "models/formats/gguf_types.h"

#include <cstring>

#include "tensor/dtype.h"
#include "tensor/error.h"

namespace dtr::gguf {

namespace {

inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16::half_to_float(h);
}

// ---- plain types ---------------------------------------------------------------------------
void dq_f32(const uint8_t* s, float* y, int64_t n) { std::memcpy(y, s, static_cast<size_t>(n) * 4); }
void dq_f16(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = h2f(s + 2 * i);
}
void dq_bf16(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(s[2 * i] | (s[2 * i + 1] << 8)) << 16;
    std::memcpy(&y[i], &u, 4);
  }
}
void dq_f64(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double d;
    std::memcpy(&d, s + 8 * i, 8);
    y[i] = static_cast<float>(d);
  }
}
template <class T>
void dq_int(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, s + sizeof(T) * i, sizeof(T));
    y[i] = static_cast<float>(v);
  }
}

// ---- 32-value blocks -------------------------------------------------------------------------
// Q4_0 {f16 d; u8 qs[16]}: x[j] = (lo nibble(qs[j]) - 8) d, x[j+16] = (hi nibble(qs[j]) - 8) d.
void dq_q4_0(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 18, y += kQK) {
    const float d = h2f(s);
    const uint8_t* qs = s + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}
// Q4_1 {f16 d; f16 m; u8 qs[16]}: x = q d + m with the Q4_0 nibble layout.
void dq_q4_1(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 20, y += kQK) {
    const float d = h2f(s), m = h2f(s + 2);
    const uint8_t* qs = s + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}
// Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}: 5th bit of value j is bit j of qh (u32 LE);
// x = (q - 16) d.
void dq_q5_0(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 22, y += kQK) {
    const float d = h2f(s);
    uint32_t qh;
    std::memcpy(&qh, s + 2, 4);
    const uint8_t* qs = s + 6;
    for (int j = 0; j < 16; ++j) {
      const int x0 = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
      const int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = static_cast<float>(x0 - 16) * d;
      y[j + 16] = static_cast<float>(x1 - 16) * d;
    }
  }
}
// Q5_1 {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: x = q d + m, bits as Q5_0.
void dq_q5_1(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 24, y += kQK) {
    const float d = h2f(s), m = h2f(s + 2);
    uint32_t qh;
    std::memcpy(&qh, s + 4, 4);
    const uint8_t* qs = s + 8;
    for (int j = 0; j < 16; ++j) {
      const int x0 = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
      const int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = static_cast<float>(x0) * d + m;
      y[j + 16] = static_cast<float>(x1) * d + m;
    }
  }
}
// Q8_0 {f16 d; i8 qs[32]}: x = q d.
void dq_q8_0(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, s += 34, y += kQK) {
    const float d = h2f(s);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(s[2 + j])) * d;
  }
}

// ---- 256-value super-blocks (k-quants) -------------------------------------------------------
// 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min packed in 12 bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}
// Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: x = d sc_i q - dmin m_i; each 64 values
// take the low nibbles of 32 bytes (sub-block 2k) then their high nibbles (sub-block 2k+1).
void dq_q4_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, s += 144) {
    const float d = h2f(s), dmin = h2f(s + 2);
    const uint8_t* scales = s + 4;
    const uint8_t* q = s + 16;
    for (int j = 0, is = 0; j < kQK_K; j += 64, q += 32, is += 2) {
      uint8_t sc, m;
      scale_min_k4(is, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}
// Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: as Q4_K with a 5th bit per
// value from qh (bit 2k for the low-nibble half, bit 2k+1 for the high-nibble half).
void dq_q5_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, s += 176) {
    const float d = h2f(s), dmin = h2f(s + 2);
    const uint8_t* scales = s + 4;
    const uint8_t* qh = s + 16;
    const uint8_t* ql = s + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQK_K; j += 64, ql += 32, is += 2, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      scale_min_k4(is, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0x0F) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}
// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: 6-bit values (4 low bits in ql, 2 high
// bits in qh), x = d scale_i (q - 32), 16 sub-blocks of 16 values.
void dq_q6_k(const uint8_t* s, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, s += 210) {
    const uint8_t* ql = s;
    const uint8_t* qh = s + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192);
    const float d = h2f(s + 208);
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * static_cast<float>(q1);
        y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

const std::vector<TypeTraits>& all_types() {
  static const std::vector<TypeTraits> kTypes = {
      {0, "F32", 1, 4, dq_f32},
      {1, "F16", 1, 2, dq_f16},
      {2, "Q4_0", kQK, 18, dq_q4_0},
      {3, "Q4_1", kQK, 20, dq_q4_1},
      {6, "Q5_0", kQK, 22, dq_q5_0},
      {7, "Q5_1", kQK, 24, dq_q5_1},
      {8, "Q8_0", kQK, 34, dq_q8_0},
      {12, "Q4_K", kQK_K, 144, dq_q4_k},
      {13, "Q5_K", kQK_K, 176, dq_q5_k},
      {14, "Q6_K", kQK_K, 210, dq_q6_k},
      {24, "I8", 1, 1, dq_int<int8_t>},
      {25, "I16", 1, 2, dq_int<int16_t>},
      {26, "I32", 1, 4, dq_int<int32_t>},
      {27, "I64", 1, 8, dq_int<int64_t>},
      {28, "F64", 1, 8, dq_f64},
      {30, "BF16", 1, 2, dq_bf16},
  };
  return kTypes;
}

const TypeTraits* find_type(uint32_t id) {
  for (const auto& t : all_types())
    if (t.id == id) return &t;
  return nullptr;
}

const TypeTraits& type_traits(uint32_t id, const std::string& context) {
  const TypeTraits* t = find_type(id);
  if (!t) {
    std::string known;
    for (const auto& k : all_types()) known += std::string(known.empty() ? "" : " ") + k.name;
    DTR_ERROR(context, ": unknown or unsupported ggml tensor type id ", id, " (supported: ", known, ")");
  }
  return *t;
}

int64_t row_bytes(const TypeTraits& t, int64_t n, const std::string& context) {
  DTR_CHECK(n % t.block_size == 0, context, ": row of ", n, " values is not a multiple of the ", t.name,
            " block size ", t.block_size);
  int64_t bytes = 0;
  DTR_CHECK(n >= 0 && !__builtin_mul_overflow(n / t.block_size, t.type_size, &bytes), context, ": row of ", n, " ",
            t.name, " values overflows the byte count");
  return bytes;
}

}  // namespace dtr::gguf
