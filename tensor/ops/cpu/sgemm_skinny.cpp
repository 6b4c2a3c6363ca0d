// The memory-bound paths of dtr's AVX-512 SGEMM (sgemm.h): LoRA's rank-8 products, where
// packing the big operand would cost more than the FLOPs. See sgemm.h for which shape takes
// which path and sgemm_internal.h for the shared pieces.
#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#ifdef __AVX512F__
#include "tensor/ops/cpu/sgemm_internal.h"

namespace dtr::cpu::sgemm_detail {

/// n <= 16: C[i, 0:n] (+)= sum_p A[i,p] * Bp[p, 0:16] for R rows at a time, one FMA chain per row
/// over the whole k (B packed once into k x 16, zero padded).
template <int R>
void skinny_rows(const Problem& P, int64_t i, const float* bp) {
  __m512 acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const float* a = P.A + i * P.a_rs;
  for (int64_t p = 0; p < P.k; ++p) {
    const __m512 b = _mm512_load_ps(bp + p * 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * P.a_rs + p * P.a_cs]), b, acc[r]);
  }
  const __mmask16 mk = mask_of(P.n);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) put(P.C + (i + r) * P.ldc, acc[r], mk, P.accumulate);
}

using SkinnyFn = void (*)(const Problem&, int64_t, const float*);
template <size_t... I>
constexpr auto make_skinny(std::index_sequence<I...>) {
  return std::array<SkinnyFn, sizeof...(I)>{&skinny_rows<int(I) + 1>...};
}
constexpr int SKINNY_R = 16;
constexpr auto kSkinny = make_skinny(std::make_index_sequence<SKINNY_R>{});

void skinny_n(const Problem& P, int nt) {
  float* bp = t_bshared.get(static_cast<size_t>(P.k * 16));
  for (int64_t p = 0; p < P.k; ++p)
    for (int64_t j = 0; j < 16; ++j) bp[p * 16 + j] = j < P.n ? P.B[p * P.b_rs + j * P.b_cs] : 0.0f;
  const int64_t blocks = (P.m + SKINNY_R - 1) / SKINNY_R;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i = b * SKINNY_R, rows = std::min<int64_t>(SKINNY_R, P.m - i);
    kSkinny[rows - 1](P, i, bp);
  }
}


/// n <= 16 with row-major A: dot products along k, 16 lanes at a time. Bt[j*kp + p] = B(p, j)
/// (kp = k rounded up to 16, zero padded); R rows of A share each load of Bt. Each C element is
/// one FMA chain per lane over k, then a fixed-order horizontal sum. One call covers k-range
/// [p0, p1) of rows i..i+R-1; the lane sums carry over between ranges in state (R*N*16 floats):
/// p0 == 0 starts from zero, p1 < k stores them there, p1 == k adds them up into C. The chain per
/// lane is the same however k is cut, so the cut does not change the bits.
template <int N, int R>
void dot_rows(const Problem& P, int64_t i, const float* bt, int64_t kp, int64_t p0, int64_t p1, float* state) {
  __m512 acc[R][N];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) acc[r][j] = p0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(state + (r * N + j) * 16);
  const float* a[R];
  for (int r = 0; r < R; ++r) a[r] = P.A + (i + r) * P.a_rs;
  const bool ahead = i + 2 * R <= P.m;  // prefetch the next rows' chunk alongside
  for (int64_t p = p0; p < p1; p += 16) {
    const __mmask16 mk = mask_of(P.k - p);
    if (ahead)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(a[r] + R * P.a_rs + p), _MM_HINT_T0);
    __m512 av[R];
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) av[r] = _mm512_maskz_loadu_ps(mk, a[r] + p);
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      const __m512 b = _mm512_load_ps(bt + j * kp + p);
#pragma GCC unroll 2
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(av[r], b, acc[r][j]);
    }
  }
  if (p1 < P.k) {
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int j = 0; j < N; ++j) _mm512_store_ps(state + (r * N + j) * 16, acc[r][j]);
    return;
  }
  // Unrolled: constant indices into acc (see small_m_tile).
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r) {
    float* c = P.C + (i + r) * P.ldc;
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      const float v = hsum(acc[r][j]);
      c[j] = P.accumulate ? c[j] + v : v;
    }
  }
}

using DotFn = void (*)(const Problem&, int64_t, const float*, int64_t, int64_t, int64_t, float*);
template <size_t... I>
constexpr auto make_dot(std::index_sequence<I...>, std::integral_constant<int, 1>) {
  return std::array<DotFn, sizeof...(I)>{&dot_rows<int(I) + 1, 1>...};
}
template <size_t... I>
constexpr auto make_dot(std::index_sequence<I...>, std::integral_constant<int, 2>) {
  return std::array<DotFn, sizeof...(I)>{&dot_rows<int(I) + 1, 2>...};
}
constexpr auto kDot1 = make_dot(std::make_index_sequence<SKINNY_N>{}, std::integral_constant<int, 1>{});
constexpr auto kDot2 = make_dot(std::make_index_sequence<8>{}, std::integral_constant<int, 2>{});

constexpr int64_t DOT_GROUP = 16;            // rows that go through the k chunks together
constexpr int64_t DOT_BT_L1 = 32 * 1024;     // Bt up to this size: all of k in one chunk
constexpr int64_t DOT_CHUNK_BYTES = 16 * 1024;  // else the Bt slice of one chunk (L1 resident)

void skinny_dot(const Problem& P, int nt) {
  const int64_t kp = (P.k + 15) / 16 * 16;
  float* bt = t_bshared.get(static_cast<size_t>(P.n * kp));
  for (int64_t j = 0; j < P.n; ++j) {
    float* d = bt + j * kp;
    if (P.b_rs == 1) std::memcpy(d, P.B + j * P.b_cs, sizeof(float) * P.k);
    else
      for (int64_t p = 0; p < P.k; ++p) d[p] = P.B[p * P.b_rs + j * P.b_cs];
    std::memset(d + P.k, 0, sizeof(float) * (kp - P.k));
  }
  // When Bt (n x kp floats) would not stay in L1 beside the streaming A rows (n = 8 at k = 1536:
  // 48 KB), k goes in chunks whose Bt slice is 16 KB, each over a group of 16 rows, the lane sums
  // kept in between (same bits as one pass).
  const int64_t bt_bytes = P.n * kp * int64_t(sizeof(float));
  const int64_t kc = bt_bytes <= DOT_BT_L1 ? kp : std::max<int64_t>(16, DOT_CHUNK_BYTES / (P.n * 4) / 16 * 16);
  const int R = P.n <= 8 ? 2 : 1;
  const DotFn full = R == 2 ? kDot2[P.n - 1] : kDot1[P.n - 1], one = kDot1[P.n - 1];
  const int64_t groups = (P.m + DOT_GROUP - 1) / DOT_GROUP;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 4)
  for (int64_t g = 0; g < groups; ++g) {
    alignas(64) float state[DOT_GROUP * SKINNY_N * 16];
    const int64_t i0 = g * DOT_GROUP, i1 = std::min(P.m, i0 + DOT_GROUP);
    for (int64_t p0 = 0; p0 < P.k; p0 += kc) {
      const int64_t p1 = std::min(P.k, p0 + kc);
      int64_t i = i0;
      for (; i + R <= i1; i += R) full(P, i, bt, kp, p0, p1, state + (i - i0) * P.n * 16);
      for (; i < i1; ++i) one(P, i, bt, kp, p0, p1, state + (i - i0) * P.n * 16);
    }
  }
}

/// Small m (<= 8) with row-major B: C(r, j) = sum_p A(r, p) B(p, j) with C(r, j) at
/// C[r*c_rs + j*c_cs] (so the transposed problem C^T = B^T A^T of an n <= 16 product with
/// column-major A also lands here). 8 x 48 register tiles stream B row by row with software
/// prefetch (the rows are far apart); one FMA chain per element over the whole k.
void small_m_tile(const SmallM& S, const float* ap, int64_t j0) {
  const int64_t cols = std::min<int64_t>(SM_W, S.n - j0);
  const __mmask16 mk[3] = {mask_of(cols), mask_of(std::max<int64_t>(0, cols - 16)),
                           mask_of(std::max<int64_t>(0, cols - 32))};
  __m512 acc[SM_R][3];
#pragma GCC unroll 8
  for (int r = 0; r < SM_R; ++r) acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
  const float* b = S.B + j0;
  constexpr int64_t PD = 12;  // rows ahead to prefetch
  for (int64_t p = 0; p < S.k; ++p, b += S.ldb) {
    if (p + PD < S.k) {
      const char* f = reinterpret_cast<const char*>(b + PD * S.ldb);
      _mm_prefetch(f, _MM_HINT_T0);
      _mm_prefetch(f + 64, _MM_HINT_T0);
      _mm_prefetch(f + 128, _MM_HINT_T0);
      _mm_prefetch(f + 188, _MM_HINT_T0);
    }
    const __m512 b0 = _mm512_maskz_loadu_ps(mk[0], b), b1 = _mm512_maskz_loadu_ps(mk[1], b + 16),
                 b2 = _mm512_maskz_loadu_ps(mk[2], b + 32);
    const float* a = ap + p * SM_R;
#pragma GCC unroll 8
    for (int r = 0; r < SM_R; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r]);
      acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(ar, b2, acc[r][2]);
    }
  }
  // Constant indices into acc only (unrolled, rows past m skipped): a variable index would keep
  // acc in memory, and GCC then stores every accumulator to the stack in each iteration above.
  if (S.c_cs == 1) {
#pragma GCC unroll 8
    for (int r = 0; r < SM_R; ++r)
#pragma GCC unroll 3
      for (int q = 0; q < 3; ++q)
        if (r < S.m) put(S.C + r * S.c_rs + j0 + 16 * q, acc[r][q], mk[q], S.add);
  } else {
    alignas(64) float t[SM_R][SM_W];
#pragma GCC unroll 8
    for (int r = 0; r < SM_R; ++r)
#pragma GCC unroll 3
      for (int q = 0; q < 3; ++q) _mm512_store_ps(&t[r][16 * q], acc[r][q]);
    for (int64_t j = 0; j < cols; ++j) {
      float* c = S.C + (j0 + j) * S.c_cs;
      for (int64_t r = 0; r < S.m; ++r) c[r * S.c_rs] = S.add ? c[r * S.c_rs] + t[r][j] : t[r][j];
    }
  }
}

void small_m(const SmallM& S, int nt) {
  float* ap = t_apack.get(static_cast<size_t>(S.k * SM_R));
  for (int64_t p = 0; p < S.k; ++p)
    for (int64_t r = 0; r < SM_R; ++r) ap[p * SM_R + r] = r < S.m ? S.A[r * S.a_rs + p * S.a_cs] : 0.0f;
  const int64_t tiles = (S.n + SM_W - 1) / SM_W;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(dynamic, 2)
  for (int64_t t = 0; t < tiles; ++t) small_m_tile(S, ap, t * SM_W);
}

}  // namespace dtr::cpu::sgemm_detail
#endif
