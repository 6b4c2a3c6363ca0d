// AVX2 + FMA f32 GEMM (see sgemm_avx2.h for the blocking; sgemm.h for its sources).
#include "tensor/ops/cpu/sgemm_avx2.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "tensor/error.h"
#include "tensor/ops/cpu/sgemm_common.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "tensor/ops/cpu/sgemm_schedule.h"
#endif

namespace dtr::cpu {

#if defined(__AVX2__) && defined(__FMA__)

bool sgemm_avx2_available() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

namespace {

constexpr int MR = 6;               // rows of the register tile (broadcast from packed A)
constexpr int NR = 16;              // columns of the register tile (two ymm of packed B)
constexpr int64_t KC_MAX = 384;     // K block: A panel 384 x 6 (9 KB) in L1 beside a B panel (24 KB)
constexpr int64_t NC_PANELS = 64;   // B columns packed at a time: 1024
constexpr int64_t NSUB_PANELS = 8;  // B sub-block reused from L2 over all A panels: 128 columns

using sgemm_detail::Problem;
using sgemm_detail::TileQueue;
thread_local sgemm_detail::Scratch t_apack, t_bpack;  // this kernel's own, per thread

/// Register tile: C[0:M, 0:cols] (+)= Apanel[kc x 6 (first M used)] * Bpanel[kc x 16].
template <int M>
void kernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* c, int64_t ldc, int64_t cols,
            bool add) {
  __m256 c0[M], c1[M];
#pragma GCC unroll 6
  for (int i = 0; i < M; ++i) c0[i] = c1[i] = _mm256_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    _mm_prefetch(reinterpret_cast<const char*>(b + 8 * NR), _MM_HINT_T0);
#pragma GCC unroll 6
    for (int i = 0; i < M; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      c0[i] = _mm256_fmadd_ps(ai, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(ai, b1, c1[i]);
    }
    a += MR;
    b += NR;
  }
  if (cols == NR) {
#pragma GCC unroll 6
    for (int i = 0; i < M; ++i) {
      float* ci = c + i * ldc;
      if (add) {
        c0[i] = _mm256_add_ps(c0[i], _mm256_loadu_ps(ci));
        c1[i] = _mm256_add_ps(c1[i], _mm256_loadu_ps(ci + 8));
      }
      _mm256_storeu_ps(ci, c0[i]);
      _mm256_storeu_ps(ci + 8, c1[i]);
    }
    return;
  }
  // Edge columns: through a buffer, only the first `cols` reach C. Unrolled like the loops above:
  // a runtime index into c0 / c1 would keep the accumulators in memory, stored every k.
  alignas(32) float t[NR];
#pragma GCC unroll 6
  for (int i = 0; i < M; ++i) {
    _mm256_store_ps(t, c0[i]);
    _mm256_store_ps(t + 8, c1[i]);
    float* ci = c + i * ldc;
    for (int64_t j = 0; j < cols; ++j) ci[j] = add ? ci[j] + t[j] : t[j];
  }
}

using KernelFn = void (*)(int64_t, const float*, const float*, float*, int64_t, int64_t, bool);
template <size_t... I>
constexpr auto make_kernels(std::index_sequence<I...>) {
  return std::array<KernelFn, sizeof...(I)>{&kernel<int(I) + 1>...};
}
constexpr auto kKernels = make_kernels(std::make_index_sequence<MR>{});

/// In-register transpose of an 8x8 block: r[i] holds row i on entry, column i on exit.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
    r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
  }
}

/// Packs rows [0, rows) x k-range [0, kc) of A into dst[p*MR + i] (rows < MR: the rest unused).
void pack_a(const float* A, int64_t a_rs, int64_t a_cs, int64_t rows, int64_t kc, float* dst) {
  if (a_rs == 1) {  // column-major: `rows` contiguous floats per k
    for (int64_t p = 0; p < kc; ++p) std::memcpy(dst + p * MR, A + p * a_cs, sizeof(float) * rows);
    return;
  }
  for (int64_t i = 0; i < rows; ++i) {
    const float* s = A + i * a_rs;
    for (int64_t p = 0; p < kc; ++p) dst[p * MR + i] = s[p * a_cs];
  }
}

/// Packs columns [0, cols) x k-range [0, kc) of B into dst[p*NR + j], zero for j >= cols.
void pack_b(const float* B, int64_t b_rs, int64_t b_cs, int64_t cols, int64_t kc, float* dst) {
  if (b_cs == 1 && cols == NR) {  // row-major: 16 contiguous floats per k
    for (int64_t p = 0; p < kc; ++p) {
      _mm256_store_ps(dst + p * NR, _mm256_loadu_ps(B + p * b_rs));
      _mm256_store_ps(dst + p * NR + 8, _mm256_loadu_ps(B + p * b_rs + 8));
    }
  } else if (b_rs == 1 && cols == NR) {  // column-major (the linear layer's W^T): 8x8 transposes
    int64_t p0 = 0;
    for (; p0 + 8 <= kc; p0 += 8)
      for (int h = 0; h < 2; ++h) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(B + (8 * h + j) * b_cs + p0);
        transpose8(r);
        for (int q = 0; q < 8; ++q) _mm256_store_ps(dst + (p0 + q) * NR + 8 * h, r[q]);
      }
    for (; p0 < kc; ++p0)
      for (int64_t j = 0; j < NR; ++j) dst[p0 * NR + j] = B[p0 + j * b_cs];
  } else {
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t j = 0; j < NR; ++j) dst[p * NR + j] = j < cols ? B[p * b_rs + j * b_cs] : 0.0f;
  }
}

/// Tiles of row panels [i0, i1) x column panels [jc, jc + jn) for one K block of depth kc,
/// packed A in ap (panel i0 + r at ap + r*MR*kcb), packed B in bp (panel jc + q at bp + q*NR*kc):
/// per 128-column B sub-block (L2), each A panel (L1) over its B panels.
void compute(const Problem& P, int64_t kc, int64_t kcb, bool add, const float* ap, int64_t i0, int64_t i1,
             const float* bp, int64_t jc, int64_t jn) {
  for (int64_t js = 0; js < jn; js += NSUB_PANELS) {
    const int64_t je = std::min(jn, js + NSUB_PANELS);
    for (int64_t ip = i0; ip < i1; ++ip) {
      const KernelFn kern = kKernels[std::min<int64_t>(MR, P.m - ip * MR) - 1];
      const float* a = ap + (ip - i0) * MR * kcb;
      float* crow = P.C + ip * MR * P.ldc;
      for (int64_t q = js; q < je; ++q) {
        const int64_t col0 = (jc + q) * NR;
        kern(kc, a, bp + q * NR * kc, crow + col0, P.ldc, std::min<int64_t>(NR, P.n - col0), add);
      }
    }
  }
}

/// Boundaries b[0] = 0 < b[1] < .. < b.back() = n of the parts of `n` panels handed out to nt
/// threads: each part (n - start) / (2 nt) panels, clamped to [1, max_chunk] (OpenMP's guided
/// schedule): large parts first, single panels at the end, so the thread that finishes last
/// waits at most one small part. By shape and nt only; a result never depends on it.
std::vector<int64_t> guided_parts(int64_t n, int nt, int64_t max_chunk) {
  std::vector<int64_t> b{0};
  while (b.back() < n) b.push_back(b.back() + std::clamp<int64_t>((n - b.back()) / (2 * nt), 1, max_chunk));
  return b;
}

void general(const Problem& P, int nt) {
  const int64_t mp = (P.m + MR - 1) / MR, np = (P.n + NR - 1) / NR;
  const int64_t nkb = (P.k + KC_MAX - 1) / KC_MAX, kcb = (P.k + nkb - 1) / nkb;
  // Items (K block, part of C) from a TileQueue, in K order, a part taking block b + 1 only after
  // its block b finished: no barrier. Row split when there are enough row panels and B is not
  // very wide: parts of (1024-column block, 1-16 row panels, guided_parts); a thread packs the B
  // column block when its (K block, column block) changes and the A panels of each item. Column
  // split: parts of 1-8 column panels (guided_parts); a thread packs all
  // of A when its K block changes (few rows, or n > 8 m: a small share of the work) and the B
  // panels of each item.
  const bool row_split = nt == 1 || (mp >= 4 * nt && P.n <= 8 * P.m);
  const int64_t ncb = (np + NC_PANELS - 1) / NC_PANELS;
  const std::vector<int64_t> parts = row_split ? guided_parts(mp, nt, 16) : guided_parts(np, nt, NSUB_PANELS);
  const int64_t nparts = static_cast<int64_t>(parts.size()) - 1, chunk = parts[1];  // the first part is the largest
  TileQueue queue(nkb, row_split ? ncb * nparts : nparts);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    float* bp = t_bpack.get_in_parallel(static_cast<size_t>(kcb * (row_split ? std::min(NC_PANELS, np) : chunk) * NR));
    float* ap = t_apack.get_in_parallel(static_cast<size_t>((row_split ? chunk : mp) * MR * kcb));
    const auto pack_b_panels = [&](int64_t pc, int64_t kc, int64_t jc, int64_t jn) {
      for (int64_t q = 0; q < jn; ++q) {
        const int64_t col0 = (jc + q) * NR;
        pack_b(P.B + col0 * P.b_cs + pc * P.b_rs, P.b_rs, P.b_cs, std::min<int64_t>(NR, P.n - col0), kc,
               bp + q * NR * kc);
      }
    };
    const auto pack_a_panels = [&](int64_t pc, int64_t kc, int64_t p0, int64_t p1) {
      for (int64_t ip = p0; ip < p1; ++ip)
        pack_a(P.A + ip * MR * P.a_rs + pc * P.a_cs, P.a_rs, P.a_cs, std::min<int64_t>(MR, P.m - ip * MR), kc,
               ap + (ip - p0) * MR * kcb);
    };
    for (int64_t kb, tile, packed = -1; queue.take(kb, tile);) {
      const int64_t pc = kb * kcb, kc = std::min(kcb, P.k - pc);
      int64_t i0 = 0, i1 = mp, jc, jn;
      if (row_split) {
        const int64_t cb = tile / nparts;
        jc = cb * NC_PANELS;
        jn = std::min(NC_PANELS, np - jc);
        i0 = parts[tile % nparts];
        i1 = parts[tile % nparts + 1];
        if (kb * ncb + cb != packed) {
          pack_b_panels(pc, kc, jc, jn);
          packed = kb * ncb + cb;
        }
        pack_a_panels(pc, kc, i0, i1);
      } else {
        jc = parts[tile];
        jn = parts[tile + 1] - jc;
        if (kb != packed) {
          pack_a_panels(pc, kc, 0, mp);
          packed = kb;
        }
        pack_b_panels(pc, kc, jc, jn);
      }
      if (nkb > 1) queue.wait_turn(kb, tile);  // one K block: nothing to wait for, no shared line to write
      compute(P, kc, kcb, P.accumulate || pc > 0, ap, i0, i1, bp, jc, jn);
      if (nkb > 1) queue.finish(kb, tile);
    }
  }
}

}  // namespace

void sgemm_avx2(int64_t m, int64_t n, int64_t k, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate) {
  DTR_CHECK(sgemm_avx2_available(), "sgemm_avx2: this CPU has no AVX2 + FMA");
  DTR_CHECK(m >= 0 && n >= 0 && k >= 0 && ldc >= n, "sgemm_avx2: bad sizes m=", m, " n=", n, " k=", k, " ldc=", ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::memset(C + i * ldc, 0, sizeof(float) * n);
    return;
  }
  int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (m * n * k < (int64_t(1) << 18) && m * n < (int64_t(1) << 16)) nt = 1;  // as sgemm()
  general({m, n, k, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate}, nt);
}

#else  // no AVX2 + FMA for this file

bool sgemm_avx2_available() { return false; }

void sgemm_avx2(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*,
                int64_t, bool) {
  DTR_CHECK(false, "sgemm_avx2: this build has no AVX2 kernel (tensor/ops/cpu/sgemm_avx2.cpp needs -march=x86-64-v3)");
}

#endif

}  // namespace dtr::cpu
