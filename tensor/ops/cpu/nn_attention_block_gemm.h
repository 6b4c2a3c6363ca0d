#pragma once
// The block products of the CPU sdpa / sdpa_backward kernels (nn_attention_forward.cpp,
// nn_attention_backward.cpp) in f32 on AVX-512: C[m, n] (+)= A[m, k] B[k, n] for blocks that are
// already cache resident (a few hundred rows, k <= 256 keys or the 64-wide head dim), read in
// place. dtr's SGEMM (cpu/gemm.h) packs both operands on every call, which on these blocks cost
// ~15-25% of the product (the stacked queries / gradients and each score block packed again per
// key block); here a register tile of up to 14 rows x 32 columns (28 zmm accumulators)
// broadcasts A from its source with any strides and loads B's rows (unit stride in n) directly,
// as the SGEMM micro-kernel does from its packed copies, prefetching the rows 8 k ahead. The
// rows of C are cut into ceil(m / 14) tiles of balanced height (7-14 rows, no thin edge tile),
// the columns into strips of 32 (masked at the edge).
//
// An optional epilogue transforms each finished tile in registers before it is stored (the
// forward's mask + running max, the backward's P = exp(s - lse) and dS = P (dP - di)), and
// optional bounds give each row tile the columns and the k range that can be nonzero under the
// causal / window mask (Span), so the masked half of a diagonal block costs no FMAs.
//
// Determinism: every C element is one FMA chain over k in order (skipped k terms are exact
// zeros), then (accumulating) added to C; nothing depends on threads (the kernels call this
// inside their own work items).
#if defined(__AVX512F__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

// GCC 12 warns about the _mm512_undefined_* placeholders inside AVX-512 intrinsics once inlined
// (GCC bug 105593, fixed in GCC 13; sgemm_internal.h does the same): a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace dtr::cpu::attention {

/// No epilogue: the tile is stored (or added) as computed. An epilogue is a callable
/// epi(v, i, j, c, mk) -> 16 values to store at c (row i, columns j .. j + 15 of the product, c
/// its address in C, mk the columns that exist), called once per vector of the finished tile.
struct NoEpilogue {
  static constexpr bool kActive = false;
  __m512 operator()(__m512 v, int64_t, int64_t, const float*, __mmask16) const { return v; }
};

inline __mmask16 cols_mask(int64_t cols) {
  return cols >= 16 ? __mmask16(0xFFFF) : cols <= 0 ? __mmask16(0) : __mmask16((1u << cols) - 1u);
}

/// Rows of B (and of a column-major A) prefetched ahead of the FMAs: the blocks come from L2 with
/// strides the hardware prefetcher follows late.
constexpr int64_t kPrefetch = 8;

/// One tile of R rows x up to 32 columns: C[i, j] (+)= sum_p A(i, p) B(p, j), A(i, p) =
/// a[i * a_rs + p * a_cs], B(p, j) = b[p * ldb + j]; m0 / m1 mask the two 16-column halves.
/// `epi` maps the finished values before the store (see NoEpilogue); i0, j0: the tile's first
/// row and column in the product.
template <int R, class Epi>
inline void tile(int64_t k, const float* __restrict a, int64_t a_rs, int64_t a_cs, const float* __restrict b,
                 int64_t ldb, float* c, int64_t ldc, __mmask16 m0, __mmask16 m1, bool acc, const Epi& epi, int64_t i0,
                 int64_t j0) {
  __m512 c0[R], c1[R];
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, bp), b1 = _mm512_maskz_loadu_ps(m1, bp + 16);
    const float* ap = a + p * a_cs;
    _mm_prefetch(reinterpret_cast<const char*>(bp + kPrefetch * ldb), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(bp + kPrefetch * ldb + 16), _MM_HINT_T0);
    if (a_rs == 1) _mm_prefetch(reinterpret_cast<const char*>(ap + kPrefetch * a_cs), _MM_HINT_T0);
#pragma GCC unroll 14
    for (int i = 0; i < R; ++i) {
      const __m512 av = _mm512_set1_ps(ap[i * a_rs]);
      c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
    }
  }
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i) {
    float* ci = c + i * ldc;
    __m512 v0 = c0[i], v1 = c1[i];
    if (acc) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, ci));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, ci + 16));
    }
    if constexpr (Epi::kActive) {
      v0 = epi(v0, i0 + i, j0, ci, m0);
      if (m1) v1 = epi(v1, i0 + i, j0 + 16, ci + 16, m1);
    }
    _mm512_mask_storeu_ps(ci, m0, v0);
    if (m1) _mm512_mask_storeu_ps(ci + 16, m1, v1);
  }
}

/// The part of a row tile [i0, i1) of the product that can be nonzero: columns [n0, n1) and the
/// reduction range [k0, k1) (A(i, p) == 0 for p outside it, for every row of the tile). Only
/// whole 32-column strips outside [n0, n1) are skipped: they are filled with the bounds' `fill`
/// (when its `do_fill` and not accumulating) or left as they are; columns outside [n0, n1) inside
/// a computed strip are computed, so the epilogue must mask them. The k terms outside are exact
/// zeros, so skipping them leaves every sum unchanged.
struct Span {
  int64_t n0, n1, k0, k1;
};

/// Bounds of a product without known zeros: all columns, all of k.
struct FullBounds {
  bool do_fill = false;
  float fill = 0.0f;
  Span operator()(int64_t, int64_t) const { return {0, INT64_MAX, 0, INT64_MAX}; }
};

/// Bounds from the causal / window mask of an attention block. Row r of the product sees the
/// columns [lo[r], hi[r]); both are nondecreasing in r (later queries see later keys), so a row
/// tile [i0, i1) has the columns [lo[i0], hi[i1 - 1]) (RowRanges; with on_k these are the k range
/// instead, for dS k where the keys are k) and, for the products
/// whose k runs over those rows and whose rows are the columns (P^T g, dS^T q, P v), a row tile
/// [j0, j1) of columns is reached only from the k rows [first r with hi[r] > j0, last r with
/// lo[r] < j1] (ColumnRanges, all columns).
struct RowRanges {
  const int32_t* lo;
  const int32_t* hi;
  int64_t n, k;
  bool on_k = false;  // the ranges restrict k (dS k: rows are queries, k the keys), not the columns
  bool do_fill = false;
  float fill = 0.0f;
  Span operator()(int64_t i0, int64_t i1) const {
    if (on_k) return {0, n, lo[i0], hi[i1 - 1]};
    return {lo[i0], hi[i1 - 1], 0, k};
  }
};

struct ColumnRanges {
  const int32_t* lo;
  const int32_t* hi;
  int64_t rows, n;  // rows of lo / hi (the k of the product), columns of the product
  bool do_fill = false;
  float fill = 0.0f;
  Span operator()(int64_t j0, int64_t j1) const {
    const int64_t k0 = std::upper_bound(hi, hi + rows, static_cast<int32_t>(j0)) - hi;   // first hi > j0
    const int64_t k1 = std::lower_bound(lo, lo + rows, static_cast<int32_t>(j1)) - lo;   // first lo >= j1
    return {0, n, k0, k1};
  }
};

/// C[m, n] (+)= A B (C row-major with row stride ldc; see tile for A and B), then epi on every
/// stored value (epi sees the sum including C's old value when accumulating). `bounds(i0, i1)`
/// gives each row tile's nonzero part (Span): the causal mask's zeros cost neither FMAs nor
/// epilogue work.
template <class Epi = NoEpilogue, class Bounds = FullBounds>
void block_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                int64_t ldb, float* c, int64_t ldc, bool acc, const Epi& epi = Epi{}, const Bounds& bounds = Bounds{}) {
  if (m <= 0 || n <= 0) return;
  const int64_t tiles = (m + 13) / 14, base = m / tiles, extra = m % tiles;  // rows per tile: base or base + 1
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    const int64_t jn = std::min<int64_t>(32, n - j0);
    const __mmask16 m0 = cols_mask(jn), m1 = cols_mask(jn - 16);
    int64_t i0 = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t rows = base + (t < extra ? 1 : 0);
      float* ct = c + i0 * ldc + j0;
      const Span sp = bounds(i0, i0 + rows);
      if (sp.n1 <= j0 || sp.n0 >= j0 + jn) {  // the strip is outside the tile's nonzero columns
        if (bounds.do_fill && !acc)
          for (int64_t i = 0; i < rows; ++i) {
            _mm512_mask_storeu_ps(ct + i * ldc, m0, _mm512_set1_ps(bounds.fill));
            _mm512_mask_storeu_ps(ct + i * ldc + 16, m1, _mm512_set1_ps(bounds.fill));
          }
        i0 += rows;
        continue;
      }
      const int64_t k0 = std::clamp<int64_t>(sp.k0, 0, k), kk = std::clamp<int64_t>(sp.k1, k0, k) - k0;
      const float* at = a + i0 * a_rs + k0 * a_cs;
      const float* bt = b + k0 * ldb + j0;
      switch (rows) {
#define DTR_ATTN_TILE(R)                                                     \
  case R:                                                                    \
    tile<R>(kk, at, a_rs, a_cs, bt, ldb, ct, ldc, m0, m1, acc, epi, i0, j0); \
    break;
        DTR_ATTN_TILE(1)
        DTR_ATTN_TILE(2)
        DTR_ATTN_TILE(3)
        DTR_ATTN_TILE(4)
        DTR_ATTN_TILE(5)
        DTR_ATTN_TILE(6)
        DTR_ATTN_TILE(7)
        DTR_ATTN_TILE(8)
        DTR_ATTN_TILE(9)
        DTR_ATTN_TILE(10)
        DTR_ATTN_TILE(11)
        DTR_ATTN_TILE(12)
        DTR_ATTN_TILE(13)
        DTR_ATTN_TILE(14)
#undef DTR_ATTN_TILE
      }
      i0 += rows;
    }
  }
}

}  // namespace dtr::cpu::attention
#endif
