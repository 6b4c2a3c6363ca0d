// AVX-512 f32 GEMM (see sgemm.h for the blocking and its sources).
#include "tensor/ops/cpu/sgemm.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "tensor/error.h"

#ifdef __AVX512F__
#include "tensor/ops/cpu/sgemm_internal.h"
#include "tensor/ops/cpu/sgemm_schedule.h"
#endif

namespace dtr::cpu {

#ifdef __AVX512F__

bool sgemm_available() { return true; }

using namespace sgemm_detail;

namespace sgemm_detail {
thread_local Scratch t_apack, t_bshared, t_bprivate;
}  // namespace sgemm_detail

namespace {

thread_local Scratch t_apanel;  // packed A: one panel (row_split_a_streaming) or a row chunk (row_split_packed), per worker

/// Register tile: C[0:M, 0:32] (+)= Apanel[kc x 14 (first M used)] * Bpanel[kc x 32].
template <int M>
void kernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* c, int64_t ldc, __mmask16 m0,
            __mmask16 m1, Put add) {
  __m512 c0[M], c1[M];
#pragma GCC unroll 14
  for (int i = 0; i < M; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
    _mm_prefetch(reinterpret_cast<const char*>(b + 8 * NR), _MM_HINT_T0);
#pragma GCC unroll 14
    for (int i = 0; i < M; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i]);
      c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
    }
    a += MR;
    b += NR;
  }
#pragma GCC unroll 14
  for (int i = 0; i < M; ++i) {
    put(c + i * ldc, c0[i], m0, add);
    put(c + i * ldc + 16, c1[i], m1, add);
  }
}

using KernelFn = void (*)(int64_t, const float*, const float*, float*, int64_t, __mmask16, __mmask16, Put);
template <size_t... I>
constexpr auto make_kernels(std::index_sequence<I...>) {
  return std::array<KernelFn, sizeof...(I)>{&kernel<int(I) + 1>...};
}
constexpr auto kKernels = make_kernels(std::make_index_sequence<MR>{});

/// In-register transpose of a 16x16 block: r[i] holds row i on entry, column i on exit
/// (unpack within 128-bit lanes, then a 4x4 transpose of the lanes).
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // Now lane l of r[4i + j] holds rows 4i..4i+3 of column 4l + j.
  for (int j = 0; j < 4; ++j) {
    const __m512 u0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x44), u1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xEE);
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x44);
    const __m512 u3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xEE);
    t[j] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
    t[8 + j] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

/// Loads `rows` (<= 16) rows of 16 floats (the first `len` of each) starting at src with row
/// stride ld, transposes them and stores vector q (q < len: element i = row i) via store(q, v).
template <class Store>
inline void transpose_block(const float* src, int64_t ld, int rows, int64_t len, Store store) {
  __m512 r[16];
  const __mmask16 mk = mask_of(len);
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(mk, src + i * ld) : _mm512_setzero_ps();
  transpose16(r);
  for (int64_t q = 0; q < len; ++q) store(q, r[q]);
}

/// Packs rows [0, rows) x k-range [0, kc) of A into dst[p*MR + i].
void pack_a(const float* A, int64_t a_rs, int64_t a_cs, int64_t rows, int64_t kc, float* dst) {
  if (a_rs == 1 && rows == MR) {  // column-major: 14 contiguous floats per k
    for (int64_t p = 0; p < kc; ++p)
      _mm512_mask_storeu_ps(dst + p * MR, 0x3FFF, _mm512_maskz_loadu_ps(0x3FFF, A + p * a_cs));
  } else if (a_cs == 1) {  // row-major: transpose 14 x 16 blocks
    for (int64_t p0 = 0; p0 < kc; p0 += 16)
      transpose_block(A + p0, a_rs, static_cast<int>(rows), std::min<int64_t>(16, kc - p0),
                      [&](int64_t q, __m512 v) { _mm512_mask_storeu_ps(dst + (p0 + q) * MR, 0x3FFF, v); });
  } else {
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t i = 0; i < rows; ++i) dst[p * MR + i] = A[i * a_rs + p * a_cs];
  }
}

/// Packs columns [0, cols) x k-range [0, kc) of B into dst[p*NR + j], zero for j >= cols.
void pack_b(const float* B, int64_t b_rs, int64_t b_cs, int64_t cols, int64_t kc, float* dst) {
  if (b_cs == 1) {  // row-major: 32 contiguous floats per k
    const __mmask16 m0 = mask_of(cols), m1 = mask_of(cols - 16 > 0 ? cols - 16 : 0);
    for (int64_t p = 0; p < kc; ++p) {
      const float* s = B + p * b_rs;
      _mm512_store_ps(dst + p * NR, _mm512_maskz_loadu_ps(m0, s));
      _mm512_store_ps(dst + p * NR + 16, _mm512_maskz_loadu_ps(m1, s + 16));
    }
  } else if (b_rs == 1) {  // column-major: transpose two 16 x 16 blocks per 16 k
    for (int64_t p0 = 0; p0 < kc; p0 += 16)
      for (int h = 0; h < 2; ++h) {
        const int64_t c = std::max<int64_t>(0, std::min<int64_t>(16, cols - 16 * h));
        transpose_block(B + 16 * h * b_cs + p0, b_cs, static_cast<int>(c), std::min<int64_t>(16, kc - p0),
                        [&](int64_t q, __m512 v) { _mm512_store_ps(dst + (p0 + q) * NR + 16 * h, v); });
      }
  } else {
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t j = 0; j < NR; ++j) dst[p * NR + j] = j < cols ? B[p * b_rs + j * b_cs] : 0.0f;
  }
}


/// Row panel ip (packed A at a) times packed B panels [q0, q1) of the column block at panel jc
/// (panel jc + q at bp + q*NR*kc), one K block of depth kc.
inline void panel_times(const Problem& P, int64_t kc, Put add, const float* a, int64_t ip, const float* bp,
                        int64_t jc, int64_t q0, int64_t q1) {
  const int64_t rows = std::min<int64_t>(MR, P.m - ip * MR);
  const KernelFn kern = kKernels[rows - 1];
  float* crow = P.C + ip * MR * P.ldc;
  for (int64_t q = q0; q < q1; ++q) {
    const int64_t col0 = (jc + q) * NR, cols = std::min<int64_t>(NR, P.n - col0);
    kern(kc, a, bp + q * NR * kc, crow + col0, P.ldc, mask_of(cols), mask_of(cols > 16 ? cols - 16 : 0), add);
  }
}

/// Tiles of row panels [i0, i1) x column panels [jc, jc + jn) for one K block of depth kc,
/// packed A in ap (panel i0 + r at ap + r*MR*kcb), packed B in bp (panel jc + q at bp + q*NR*kc).
void compute(const Problem& P, int64_t kc, int64_t kcb, Put add, const float* ap, int64_t i0, int64_t i1,
             const float* bp, int64_t jc, int64_t jn) {
  for (int64_t js = 0; js < jn; js += NSUB_PANELS)
    for (int64_t ip = i0; ip < i1; ++ip)
      panel_times(P, kc, add, ap + (ip - i0) * MR * kcb, ip, bp, jc, js, std::min(jn, js + NSUB_PANELS));
}

/// Packs B's column panels [jc, jc + jn) of the K block at pc (depth kc) into bp (panel jc + q at
/// bp + q*NR*kc).
void pack_b_panels(const Problem& P, int64_t pc, int64_t kc, int64_t jc, int64_t jn, float* bp) {
  for (int64_t q = 0; q < jn; ++q) {
    const int64_t col0 = (jc + q) * NR;
    pack_b(P.B + col0 * P.b_cs + pc * P.b_rs, P.b_rs, P.b_cs, std::min<int64_t>(NR, P.n - col0), kc, bp + q * NR * kc);
  }
}

/// Packs A's row panels [p0, p1) of the K block at pc (depth kc) into dst (panel p0 + r at
/// dst + r*MR*kcb).
void pack_a_panels(const Problem& P, int64_t pc, int64_t kc, int64_t kcb, int64_t p0, int64_t p1, float* dst) {
  for (int64_t ip = p0; ip < p1; ++ip)
    pack_a(P.A + ip * MR * P.a_rs + pc * P.a_cs, P.a_rs, P.a_cs, std::min<int64_t>(MR, P.m - ip * MR), kc,
           dst + (ip - p0) * MR * kcb);
}

/// How the K block at pc reaches C: added after the first block or when accumulating; else
/// non-temporal stores when C is written once (one K block) and is larger than STREAM_BYTES.
Put put_mode(const Problem& P, int64_t pc, int64_t nkb) {
  if (P.accumulate || pc > 0) return Put::Add;
  return nkb == 1 && P.m * P.ldc * int64_t(sizeof(float)) >= STREAM_BYTES ? Put::Stream : Put::Store;
}

/// Bytes of packed B one core keeps in its L2 while A panels stream past: 3/4 of the L2
/// (sysconf; 1 MiB assumed when unknown), the rest for the A panel, C tiles and the source of A.
int64_t l2_b_bytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return (l2 > 0 ? static_cast<int64_t>(l2) : int64_t{1} << 20) * 3 / 4;
  }();
  return bytes;
}

/// Row split with all of B in L2 (n up to ~576 columns at kc 512 on a 2 MB L2: the weight
/// gradients and lm_head's tall products): items (K block, chunk of row panels) from a TileQueue;
/// a thread packs all of B of a K block when its first item of that block arrives, then packs
/// each A panel just before using it (into an L1-sized buffer) and runs it over every B panel.
/// A is read once from its source and never written back packed.
void row_split_a_streaming(const Problem& P, int nt, int64_t kcb) {
  const int64_t mp = (P.m + MR - 1) / MR, np = (P.n + NR - 1) / NR, nkb = (P.k + kcb - 1) / kcb;
  const bool stream = put_mode(P, 0, nkb) == Put::Stream;
  const int64_t chunk = std::max<int64_t>(1, 16 / np);  // >= 16 kernel calls per item
  TileQueue queue(nkb, (mp + chunk - 1) / chunk);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    float* bp = t_bprivate.get_in_parallel(static_cast<size_t>(kcb * np * NR));
    float* ap = t_apanel.get_in_parallel(static_cast<size_t>(kcb * MR));
    for (int64_t kb, tile, packed = -1; queue.take(kb, tile);) {
      const int64_t pc = kb * kcb, kc = std::min(kcb, P.k - pc);
      if (kb != packed) {
        pack_b_panels(P, pc, kc, 0, np, bp);
        packed = kb;
      }
      queue.wait_turn(kb, tile);
      for (int64_t ip = tile * chunk; ip < std::min(mp, (tile + 1) * chunk); ++ip) {
        pack_a_panels(P, pc, kc, kcb, ip, ip + 1, ap);
        panel_times(P, kc, put_mode(P, pc, nkb), ap, ip, bp, 0, 0, np);
      }
      queue.finish(kb, tile);
    }
    if (stream) _mm_sfence();  // order this thread's non-temporal stores before the join
  }
}

/// Row split with B too large for the L2: items (K block, column block of NC_PANELS, chunk of
/// 1-8 row panels: about 8 per thread; B's 256-column sub-blocks stay in L2 over a chunk) from a
/// TileQueue; a thread packs the B column block when its (K block, column block) changes, and
/// the A panels of each chunk.
void row_split_packed(const Problem& P, int nt, int64_t kcb) {
  const int64_t mp = (P.m + MR - 1) / MR, np = (P.n + NR - 1) / NR, nkb = (P.k + kcb - 1) / kcb;
  const int64_t ncb = (np + NC_PANELS - 1) / NC_PANELS, rchunk = std::clamp<int64_t>(mp / (8 * nt), 1, 8);
  const int64_t rtiles = (mp + rchunk - 1) / rchunk;
  const bool stream = put_mode(P, 0, nkb) == Put::Stream;
  TileQueue queue(nkb, ncb * rtiles);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    float* bp = t_bprivate.get_in_parallel(static_cast<size_t>(kcb * std::min(NC_PANELS, np) * NR));
    float* ap = t_apanel.get_in_parallel(static_cast<size_t>(rchunk * MR * kcb));
    for (int64_t kb, tile, packed = -1; queue.take(kb, tile);) {
      const int64_t pc = kb * kcb, kc = std::min(kcb, P.k - pc), cb = tile / rtiles;
      const int64_t jc = cb * NC_PANELS, jn = std::min(NC_PANELS, np - jc);
      const int64_t i0 = tile % rtiles * rchunk, i1 = std::min(mp, i0 + rchunk);
      if (kb * ncb + cb != packed) {
        pack_b_panels(P, pc, kc, jc, jn, bp);
        packed = kb * ncb + cb;
      }
      pack_a_panels(P, pc, kc, kcb, i0, i1, ap);
      queue.wait_turn(kb, tile);
      compute(P, kc, kcb, put_mode(P, pc, nkb), ap, i0, i1, bp, jc, jn);
      queue.finish(kb, tile);
    }
    if (stream) _mm_sfence();
  }
}

/// Column split (few row panels, or a very wide B): per K block A packed by all threads into one
/// buffer, then chunks of 1-8 column panels (about 4 per thread) from a counter, each thread
/// packing the B panels of its chunks; two barriers per K block.
void column_split(const Problem& P, int nt, int64_t kcb) {
  const int64_t mp = (P.m + MR - 1) / MR, np = (P.n + NR - 1) / NR, nkb = (P.k + kcb - 1) / kcb;
  const int64_t cchunk = std::clamp<int64_t>(np / (4 * nt), 1, NSUB_PANELS);
  const bool stream = put_mode(P, 0, nkb) == Put::Stream;
  Chunks chunks(nkb, np, cchunk);
  float* ap = t_apack.get(static_cast<size_t>(mp * MR * kcb));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int T = omp_get_num_threads(), t = omp_get_thread_num();
    float* bp = t_bprivate.get_in_parallel(static_cast<size_t>(kcb * cchunk * NR));
    for (int64_t pc = 0, kb = 0; pc < P.k; pc += kcb, ++kb) {
      const int64_t kc = std::min(kcb, P.k - pc);
      const auto [p0, p1] = part(mp, T, t);
      pack_a_panels(P, pc, kc, kcb, p0, p1, ap + p0 * MR * kcb);
#pragma omp barrier
      for (int64_t j0, j1; chunks.take(kb, j0, j1);) {
        pack_b_panels(P, pc, kc, j0, j1 - j0, bp);
        compute(P, kc, kcb, put_mode(P, pc, nkb), ap, 0, mp, bp, j0, j1 - j0);
      }
      // The next K block repacks A and adds to C tiles other threads may still use.
      if (pc + kcb < P.k) {
#pragma omp barrier
      }
    }
    if (stream) _mm_sfence();
  }
}

void general(const Problem& P, int nt) {
  const int64_t mp = (P.m + MR - 1) / MR, np = (P.n + NR - 1) / NR;
  // The K blocking depends on k alone, never on m: a row range of C then gets the bits of the
  // whole product, which grouped_mm's row pieces rely on (one K block up to k = 1024 for a C of
  // 16 MB or more ran lm_head's dW x1.05-1.23 faster but broke that, and was not kept).
  const int64_t nkb = (P.k + KC_MAX - 1) / KC_MAX, kcb = (P.k + nkb - 1) / nkb;
  // Row split (each thread packs all of B and the A panels of the row chunks it takes, no
  // barrier; the duplicated B packing costs nt/(2m) of the FLOPs) when there are enough row
  // panels, except for very wide B (lm_head forward: measured faster split by columns).
  if (nt > 1 && (mp < 4 * nt || P.n > 8 * P.m)) return column_split(P, nt, kcb);
  if (np <= NC_PANELS && kcb * np * NR * int64_t(sizeof(float)) <= l2_b_bytes()) return row_split_a_streaming(P, nt, kcb);
  row_split_packed(P, nt, kcb);
}

}  // namespace

void sgemm(int64_t m, int64_t n, int64_t k, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
           int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  DTR_CHECK(m >= 0 && n >= 0 && k >= 0 && ldc >= n, "sgemm: bad sizes m=", m, " n=", n, " k=", k, " ldc=", ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::memset(C + i * ldc, 0, sizeof(float) * n);
    return;
  }
  const Problem P{m, n, k, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate};
  // Threads only pay off above ~0.5 MFLOP or when C is large (bandwidth); the result does not
  // depend on the choice.
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (m * n * k < (int64_t(1) << 18) && m * n < (int64_t(1) << 16)) nt = 1;
  if (m <= SM_R && b_cs == 1 && n > SKINNY_N) {
    small_m({m, n, k, A, a_rs, a_cs, B, b_rs, C, ldc, 1, accumulate}, nt);
  } else if (n <= SM_R && a_rs == 1 && a_cs != 1 && m > SM_R) {  // C^T = B^T A^T
    small_m({n, m, k, B, b_cs, b_rs, A, a_cs, C, 1, ldc, accumulate}, nt);
  } else if (n <= SKINNY_N && a_cs == 1) {
    skinny_dot(P, nt);
  } else if (n <= SKINNY_N) {
    skinny_n(P, nt);
  } else {
    general(P, nt);
  }
}

#else  // no AVX-512 in this build

bool sgemm_available() { return false; }

void sgemm(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t,
           bool) {
  DTR_CHECK(false, "sgemm: this build has no AVX-512 kernels (compile tensor/ops/cpu with -march=x86-64-v4)");
}

#endif

}  // namespace dtr::cpu
