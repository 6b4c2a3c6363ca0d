#pragma once
// Internals shared by the two halves of dtr's AVX-512 SGEMM (sgemm.h): the packed general path
// in sgemm.cpp and the memory-bound skinny paths in sgemm_skinny.cpp. Included only by those
// files, only when compiled with AVX-512.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "tensor/error.h"
#include "tensor/ops/cpu/sgemm_common.h"

// GCC 12 warns about the _mm*_undefined_* placeholder inside AVX-512 intrinsics such as
// _mm512_shuffle_f32x4 once inlined (GCC bug 105593, fixed in GCC 13): a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace dtr::cpu::sgemm_detail {

constexpr int MR = 14;             // rows of the register tile (broadcast from packed A)
constexpr int NR = 32;             // columns of the register tile (two zmm of packed B)
// K block. The A panel (kc x 14, <= 35 KB) does not stay in the 48 KB L1 while a B panel (kc x
// 32, 80 KB) streams past it, so both come from L2 (184 bytes per k, 14 cycles of FMAs); blocks of
// 256-384 (A + B panel within L1) measured no faster (sgemm.h), and 640 keeps K = 576 in one block.
constexpr int64_t KC_MAX = 640;
constexpr int64_t NC_PANELS = 64;  // B columns packed at a time: 64 panels = 2048 columns
constexpr int64_t NSUB_PANELS = 8; // B sub-block reused from L2 over all A panels: 256 columns
constexpr int SKINNY_N = 16;       // n <= 16: one masked zmm of C per row
constexpr int64_t STREAM_BYTES = int64_t(1) << 24;  // C of 16 MB and more: non-temporal stores

extern thread_local Scratch t_apack, t_bshared, t_bprivate;  // t_bprivate: per worker (in sgemm.cpp)

inline __mmask16 mask_of(int64_t cols) { return cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1u); }

/// Adds (add) or stores acc into 16 floats of C at c under mask mk (mk == 0xFFFF: full).
inline void put(float* c, __m512 acc, __mmask16 mk, bool add) {
  if (mk == 0xFFFF) {
    if (add) acc = _mm512_add_ps(acc, _mm512_loadu_ps(c));
    _mm512_storeu_ps(c, acc);
  } else if (mk) {
    if (add) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mk, c));
    _mm512_mask_storeu_ps(c, mk, acc);
  }
}

/// How the register tile reaches C: store, add, or non-temporal store (C = A*B too large for the
/// caches: skips the read-for-ownership; only full, 64-byte aligned vectors, the rest stored).
enum class Put { Store, Add, Stream };

inline void put(float* c, __m512 acc, __mmask16 mk, Put mode) {
  if (mode == Put::Stream && mk == 0xFFFF && (reinterpret_cast<uintptr_t>(c) & 63) == 0) _mm512_stream_ps(c, acc);
  else put(c, acc, mk, mode == Put::Add);
}



/// Sum of the 16 lanes in a fixed order (halves, quarters, pairs, neighbours).
inline float hsum(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
  return _mm512_cvtss_f32(v);
}

/// The skinny paths (sgemm_skinny.cpp); nt threads at most.
/// n <= 16 with row-major A: dot products along k.
void skinny_dot(const Problem& P, int nt);
/// n <= 16 otherwise: one masked zmm of C per row.
void skinny_n(const Problem& P, int nt);
/// m <= 8 with row-major B (and n <= 8 with column-major A, transposed by the caller).
struct SmallM {
  int64_t m, n, k;
  const float* A;
  int64_t a_rs, a_cs;
  const float* B;
  int64_t ldb;
  float* C;
  int64_t c_rs, c_cs;
  bool add;
};
constexpr int SM_R = 8, SM_W = 48;
void small_m(const SmallM& S, int nt);

}  // namespace dtr::cpu::sgemm_detail
