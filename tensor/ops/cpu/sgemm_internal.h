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

// GCC 12 warns about the _mm*_undefined_* placeholder inside AVX-512 intrinsics such as
// _mm512_shuffle_f32x4 once inlined (GCC bug 105593, fixed in GCC 13): a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace dtr::cpu::sgemm_detail {

constexpr int MR = 14;             // rows of the register tile (broadcast from packed A)
constexpr int NR = 32;             // columns of the register tile (two zmm of packed B)
constexpr int64_t KC_MAX = 640;    // K block: A panel kc x 14 (<= 35 KB) stays in the 48 KB L1
constexpr int64_t NC_PANELS = 64;  // B columns packed at a time: 64 panels = 2048 columns
constexpr int64_t NSUB_PANELS = 8; // B sub-block reused from L2 over all A panels: 256 columns
constexpr int SKINNY_N = 16;       // n <= 16: one masked zmm of C per row
constexpr int64_t STREAM_BYTES = int64_t(1) << 24;  // C of 16 MB and more: non-temporal stores

/// Grow-only 64-byte aligned scratch (one per thread and role; reused across calls). Not counted
/// by memory_stats(): the packed A of one K block (m x kc floats, kc <= 640; twice that in the
/// column split; 126 MB for a full fine-tune's lm_head weight gradient, m = 49152) on the
/// calling thread, plus kc x 2048 floats of packed B per worker. get() throws dtr::Error when out of memory;
/// get_in_parallel() is for OpenMP workers, where an exception cannot leave the region: it
/// prints the same message and aborts.
struct Scratch {
  float* p = nullptr;
  size_t cap = 0;
  float* try_get(size_t n) {
    if (n > cap) {
      std::free(p);
      cap = 0;
      p = static_cast<float*>(std::aligned_alloc(64, bytes_of(n)));
      if (p) cap = n;
    }
    return p;
  }
  float* get(size_t n) {
    float* q = try_get(n);
    DTR_CHECK(q != nullptr, "sgemm: out of memory for a ", bytes_of(n), "-byte packing buffer");
    return q;
  }
  float* get_in_parallel(size_t n) {
    float* q = try_get(n);
    if (!q) {
      std::fprintf(stderr, "dtr: error: sgemm: out of memory for a %zu-byte packing buffer\n", bytes_of(n));
      std::abort();
    }
    return q;
  }
  static size_t bytes_of(size_t n) { return (n * sizeof(float) + 63) / 64 * 64; }
  ~Scratch() { std::free(p); }
};
extern thread_local Scratch t_apack, t_bshared, t_bprivate;  // t_bprivate: per worker (in sgemm.cpp)

/// [begin, end) of part t of `total` items split into T contiguous, balanced parts.
inline std::pair<int64_t, int64_t> part(int64_t total, int T, int t) { return {total * t / T, total * (t + 1) / T}; }

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


struct Problem {
  int64_t m, n, k;
  const float* A;
  int64_t a_rs, a_cs;
  const float* B;
  int64_t b_rs, b_cs;
  float* C;
  int64_t ldc;
  bool accumulate;
};

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
