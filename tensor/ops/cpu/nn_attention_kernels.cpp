// CPU kernels of sdpa (Flash-attention forward with online softmax) and sdpa_backward
// (Flash-attention 2 backward), blocks of 64 queries (per head of a GQA group) x 256 keys
// (forward) / 128 keys (backward). f32 on AVX-512: the block products run on register tiles that
// read the cache-resident blocks in place (nn_attention_block_gemm.h: dtr's SGEMM packed both
// operands of every block product, ~15-25% of its time there), with the elementwise steps in the
// tiles' epilogues (forward: mask + running column max; backward: P = exp(s - lse) with the mask,
// dS = P (dP - di)) and the causal mask's zero tiles skipped (no FMAs for the masked half of the
// diagonal blocks; the k terms skipped are exact zeros, so the sums are unchanged). Other f32
// builds: cpu::gemm (dtr's AVX2 SGEMM or Eigen) and separate passes; f64: Eigen and scalar
// std::exp. f32 exp through Eigen's vectorised packet math (cpu/vec.h).
// Masks (see Mask): causal with a diagonal offset, sliding window, document ids; a score block the
// mask hides entirely (past the diagonal, before the window, or without a document in common:
// the min / max document ids of its rows and keys do not overlap) is skipped.
// GQA: the query blocks of the heads that share a kv head are stacked query-major (stack_rows:
// row r * group + g is query r of head g, so the rows a causal key sees are one contiguous
// range), so each block product runs once per kv head with group x 64 rows. The forward computes
// the scores transposed (sT = k q^T: each query's running max / sum is a lane of the column-wise
// passes, P^T is read in place as the A of P v); the backward reads k and v as k^T / v^T
// (transposed_head, once per call) so that every B operand has unit stride. Scratch buffers are
// per thread and kept across calls (scratch()).
// Forward work items: (batch, kv head, query block), in parallel; with fewer than
// kMinForwardItems of them, fewer heads per item (a divisor of the group).
// Backward work items: (batch, kv head[, query chunk]), in parallel; each owns the dq rows of
// its query blocks and its dk / dv accumulators (the output's rows, or with query chunks, a
// buffer per chunk added at the end), so no accumulation races.
// Both loops hand the items out one at a time (schedule(dynamic)), largest first (largest_first:
// by the keys the mask lets each see), so a thread slowed by another tenant of the machine takes
// fewer and the last ones taken are small.
// bf16/f16 inputs are computed in f32 and lse is kept in f32 (registered without the
// dispatcher's upcast so that lse is not rounded to low precision).
// Layouts: q, k, v, g, out are read through their strides (unit stride in D), so the model's
// [B, T, H, D] projections transposed to [B, H, T, D] are read in place. The output is written in
// [B, T, Hq, Dv] memory order (PyTorch's CPU flash attention does the same), so the model's
// transpose back to [B, T, Hq * Dv] is a view; dq / dk / dv keep the memory order of q / k / v
// (cpu/layout.h). k / v are never repeated for GQA.
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Dense>
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/cpu_allocator.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/gemm.h"
#include "tensor/ops/cpu/layout.h"
#include "tensor/ops/cpu/nn_attention_block_gemm.h"
#include "tensor/ops/cpu/sgemm_common.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/vec.h"

namespace dtr {
namespace {

constexpr int64_t kBlockQ = 64;
// Keys per block: 256 in the forward (at T = 256 one block per query block, no rescaling of the
// accumulator), 128 in the backward. Re-measured with the register tiles (in-process A/B, 1
// thread, 2026-12-02): forward 128 keys x0.98 at [4, 9/3, 256, 64] but x1.02-1.07 at
// [1, 9/3, 2048, 64]; backward 64 keys x0.98 and 256 keys x1.00 at both: kept.
constexpr int64_t kBlockKForward = 256;
constexpr int64_t kBlockKBackward = 128;

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using CMap = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MMap = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;

/// C[m, n] (+)= A[m, k] B[k, n] with element strides (rows, columns) of A and B; C contiguous
/// with row stride n. f32 on AVX-512 (B with unit column stride): the attention tiles
/// (nn_attention_block_gemm.h); otherwise cpu::gemm (f32: dtr's AVX2 SGEMM or Eigen, serial inside
/// the work items' parallel loop; f64: Eigen).
template <class T>
void block_mm(int64_t m, int64_t n, int64_t k, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
              int64_t b_cs, T* C, bool acc) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (b_cs == 1) return cpu::attention::block_gemm(m, n, k, A, a_rs, a_cs, B, b_rs, C, n, acc);
  }
#endif
  cpu::gemm<T>(m, n, k, A, a_rs, a_cs, B, b_rs, b_cs, C, acc);
}

/// A local tensor whose last dim has stride 1 (copied when not), in compute dtype `dt`.
Tensor prepared(const Tensor& t, DType dt) {
  Tensor x = t.detach();
  if (x.dtype() != dt) x = to_dtype(x, dt);
  if (x.dim() > 0 && x.strides().back() != 1 && x.sizes().back() > 1) x = contiguous(x);
  return x;
}

/// Geometry of a [B, H, L, D] tensor with unit stride in D (T const: read, else written).
template <class T>
struct Heads {
  T* p;
  int64_t sb, sh, sl;
  Heads(const Tensor& t) : p(static_cast<T*>(t.data_ptr())), sb(t.stride(0)), sh(t.stride(1)), sl(t.stride(2)) {}
  T* at(int64_t b, int64_t h, int64_t l) const { return p + b * sb + h * sh + l * sl; }
};

/// The mask of one sdpa call beyond its shapes: causal diagonal `off` (query i sees key j <= i + off,
/// S - T when the caller gave no offsets), sliding window, and optional document ids (query i sees
/// key j only when q_doc[b, i] == k_doc[b, j]; contiguous i64 [B, T] / [B, S], null = none).
struct Mask {
  bool causal;
  int64_t window, off;
  const int64_t* q_doc = nullptr;
  const int64_t* k_doc = nullptr;
  int64_t T, S;
};

/// Number of keys any query row in [i0, i1) may see: all S, or i1 - 1 + off + 1 when causal.
int64_t key_end(const Mask& mk, int64_t i1) {
  if (!mk.causal) return mk.S;
  return std::clamp<int64_t>(i1 + mk.off, 0, mk.S);
}

/// First key any query row >= i0 may see: 0, or i0 + off - window + 1 with a sliding window.
int64_t key_begin(const Mask& mk, int64_t i0) {
  if (mk.window <= 0) return 0;
  return std::clamp<int64_t>(i0 + mk.off - mk.window + 1, 0, mk.S);
}

/// Smallest and largest document id of rows [r0, r1) of `ids`.
std::pair<int64_t, int64_t> doc_range(const int64_t* ids, int64_t r0, int64_t r1) {
  const auto [lo, hi] = std::minmax_element(ids + r0, ids + r1);
  return {*lo, *hi};
}

/// What the mask does to the score block [i0, i0 + rows) x [j0, j1) of batch row b.
enum class BlockMask { none, partial, all };

BlockMask block_mask(const Mask& mk, int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t j1) {
  bool partial = false;
  if (mk.q_doc) {
    const auto [qlo, qhi] = doc_range(mk.q_doc + b * mk.T, i0, i0 + rows);
    const auto [klo, khi] = doc_range(mk.k_doc + b * mk.S, j0, j1);
    if (qhi < klo || khi < qlo) return BlockMask::all;  // no document in common
    partial = !(qlo == qhi && klo == khi && qlo == klo);
  }
  if (mk.causal && j1 - 1 > i0 + mk.off) partial = true;                          // keys after the first row's last
  if (mk.window > 0 && j0 <= i0 + rows - 1 + mk.off - mk.window) partial = true;  // keys before the last row's first
  return partial ? BlockMask::partial : BlockMask::none;
}

/// Keys [lo, hi) of the key block [j0, j0 + nb) that query i may see under the causal and window
/// parts of the mask: j <= i + off (causal) and j > i + off - window (sliding window: a query
/// sees itself and the window - 1 keys before it). Documents are checked per key (doc_visible).
void visible_keys_of_query(const Mask& mk, int64_t i, int64_t j0, int64_t nb, int64_t& lo, int64_t& hi) {
  lo = 0;
  hi = nb;
  if (mk.causal) hi = std::clamp<int64_t>(i + mk.off + 1 - j0, 0, nb);
  if (mk.window > 0) lo = std::clamp<int64_t>(i + mk.off - mk.window + 1 - j0, 0, nb);
}

/// Stacked rows [lo, hi) of `rows` (row c: query i0 + c / heads) that key j may be seen from
/// under the causal and window parts of the mask (the same rule as visible_keys_of_query).
void visible_rows_of_key(const Mask& mk, int64_t j, int64_t i0, int64_t heads, int64_t rows, int64_t& lo,
                         int64_t& hi) {
  lo = 0;
  hi = rows;
  if (mk.causal) lo = std::clamp<int64_t>((j - mk.off - i0) * heads, 0, rows);
  if (mk.window > 0) hi = std::clamp<int64_t>((j - mk.off + mk.window - i0) * heads, 0, rows);
}

/// dst[j * ld + i] = row(i)[j] * sc for i in [0, rows), j in [0, cols): the transpose of rows at
/// row(i) (unit stride). f32 moves blocks of one packet's lanes squared through registers (Eigen's
/// ptranspose), the edges and f64 element by element.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // PacketBlock<__m512>: the vector type's attributes
template <class T, class Row>
void transpose_rows(Row row, int64_t rows, int64_t cols, T sc, T* dst, int64_t ld) {
  int64_t i0 = 0;
  if constexpr (std::is_same_v<T, float>) {
    using namespace Eigen::internal;
    using cpu::vec::detail::Packet;
    constexpr int64_t L = cpu::vec::detail::kLanes;
    const Packet ps = pset1<Packet>(sc);
    const int64_t cfull = cols / L * L;
    for (; i0 + L <= rows; i0 += L) {
      const float* src[L];
      for (int64_t u = 0; u < L; ++u) src[u] = row(i0 + u);
      for (int64_t j0 = 0; j0 < cfull; j0 += L) {
        PacketBlock<Packet, L> blk;
        for (int64_t u = 0; u < L; ++u) blk.packet[u] = pmul(ploadu<Packet>(src[u] + j0), ps);
        ptranspose(blk);
        for (int64_t u = 0; u < L; ++u) pstoreu(dst + (j0 + u) * ld + i0, blk.packet[u]);
      }
      for (int64_t j = cfull; j < cols; ++j)
        for (int64_t u = 0; u < L; ++u) dst[j * ld + i0 + u] = src[u][j] * sc;
    }
  }
  for (int64_t i = i0; i < rows; ++i) {
    const T* x = row(i);
    for (int64_t j = 0; j < cols; ++j) dst[j * ld + i] = x[j] * sc;
  }
}
#pragma GCC diagnostic pop

/// The query block [i0, i0 + n) of query heads h0 .. h0 + heads - 1 (sharing one kv head), batch
/// row b, times `sc`, stacked query-major: row c = r * heads + g is query i0 + r of head h0 + g
/// (so the rows a causal key sees are a contiguous range, and the block products share each K /
/// V block: one GEMM with heads * n rows). Written to `rm` [heads * n, D] row-major and / or to
/// `tr` [D, heads * n] (its transpose: the forward's B of sT = k q^T, unit stride along the rows)
/// when not null.
template <class T>
void stack_rows(const Heads<const T>& X, int64_t b, int64_t h0, int64_t heads, int64_t i0, int64_t n, int64_t D,
                T sc, T* rm, T* tr) {
  const int64_t rows = heads * n;
  auto row = [&](int64_t c) { return X.at(b, h0 + c % heads, i0 + c / heads); };
  if (rm)
    for (int64_t c = 0; c < rows; ++c) {
      const T* x = row(c);
      for (int64_t d = 0; d < D; ++d) rm[c * D + d] = x[d] * sc;
    }
  if (tr) transpose_rows<T>(row, rows, D, sc, tr, rows);
}

/// out[c] = exp(x[c] - shift[c]) and sum[c] += out[c] for c in [0, n) (out may equal x): f32
/// through cpu::vec's packet exp (results below FLT_MIN are 0), f64 with std::exp.
template <class T>
void exp_sub_accumulate(const T* x, const T* shift, T* out, T* sum, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    using namespace Eigen::internal;
    using cpu::vec::detail::Packet;
    constexpr int64_t L = cpu::vec::detail::kLanes;
    int64_t c = 0;
    for (; c + L <= n; c += L) {
      const Packet y = cpu::vec::detail::exp_packet(ploadu<Packet>(x + c), ploadu<Packet>(shift + c));
      pstoreu(out + c, y);
      pstoreu(sum + c, padd(ploadu<Packet>(sum + c), y));
    }
    if (c < n) {
      const int64_t t = n - c;
      alignas(64) float y[L];
      pstore(y, cpu::vec::detail::exp_packet(cpu::vec::detail::load_tail(x + c, t, 0.0f),
                                             cpu::vec::detail::load_tail(shift + c, t, 0.0f)));
      for (int64_t u = 0; u < t; ++u) {
        out[c + u] = y[u];
        sum[c + u] += y[u];
      }
    }
  } else {
    for (int64_t c = 0; c < n; ++c) {
      out[c] = std::exp(x[c] - shift[c]);
      sum[c] += out[c];
    }
  }
}

/// x[j] = exp(x[j] - shift) for j in [0, n) (f32: cpu::vec::exp_shift; f64: std::exp).
template <class T>
void exp_shift_inplace(T* x, T shift, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::vec::exp_shift(x, shift, 1.0f, x, n);
  } else {
    for (int64_t j = 0; j < n; ++j) x[j] = std::exp(x[j] - shift);
  }
}

/// A thread's scratch buffer of T: a typed view of the SGEMM's grow-only, 64-byte aligned Scratch
/// (sgemm_common.h; out of memory inside a parallel region prints the size and aborts, as an
/// exception cannot leave it).
template <class T>
struct Buffer {
  cpu::sgemm_detail::Scratch s;
  T* get(int64_t n) {
    const size_t floats = (static_cast<size_t>(n) * sizeof(T) + sizeof(float) - 1) / sizeof(float);
    return reinterpret_cast<T*>(omp_in_parallel() ? s.get_in_parallel(floats) : s.get(floats));
  }
};

/// The calling thread's scratch buffer `slot` (0-3), kept across calls: the work items' blocks,
/// small k^T / v^T and the dk / dv buffers of the non-AVX-512 path need no allocation (nor the
/// page faults of a fresh one: ~3% of a seq-256 call) after the first call. A thread holds up to
/// its largest call's: the blocks (a few hundred KB), < 1 MiB of k^T / v^T, and without AVX-512
/// 2 x S x D floats of dk / dv.
template <class T>
Buffer<T>& scratch(int slot) {
  thread_local Buffer<T> bufs[4];
  return bufs[slot];
}

/// Row stride of transposed_head's rows: S + 16, so that the rows of a block (a 32-key strip read
/// over D rows) do not all fall into the same L1 sets when S * 4 bytes is a multiple of 4 KB.
int64_t transposed_ld(int64_t S) { return S + 16; }

/// dst[d * transposed_ld(S) + j] = x[b, h, j, d]: k^T (or v^T) of one (batch row, kv head), so that
/// the block products read k and v with unit stride along the keys for every query block.
template <class T>
void transposed_head(const Heads<const T>& X, int64_t b, int64_t h, int64_t S, int64_t D, T* dst) {
  transpose_rows<T>([&](int64_t j) { return X.at(b, h, j); }, S, D, T(1), dst, transposed_ld(S));
}

/// Forward work items below which fewer query heads are stacked per item (each item then takes
/// a divisor of the group): Gemma 3's one kv head at T = 256 gave 4 items, which left threads idle
/// on the causal imbalance. By shape only (the result does not depend on the thread count).
constexpr int64_t kMinForwardItems = 16;

/// Query heads stacked per forward item: the largest divisor d of `group` with
/// kv_blocks * group / d >= kMinForwardItems (kv_blocks = batch x kv heads x query blocks), else 1.
int64_t forward_heads_per_item(int64_t group, int64_t kv_blocks) {
  for (int64_t d = group; d > 1; --d)
    if (group % d == 0 && kv_blocks * (group / d) >= kMinForwardItems) return d;
  return 1;
}

/// Calls f(j0, nb, mask) for each key block [j0, j0 + nb) of `block` keys that query rows [i0, i0 + n) of batch
/// row b may see (blocks the mask hides entirely skipped), in key order.
template <class F>
void for_each_key_block(const Mask& mk, int64_t block, int64_t b, int64_t i0, int64_t n, F&& f) {
  const int64_t jend = key_end(mk, i0 + n);
  for (int64_t j0 = key_begin(mk, i0); j0 < jend; j0 += block) {
    const int64_t j1 = std::min(jend, j0 + block);
    const BlockMask bm = block_mask(mk, b, i0, n, j0, j1);
    if (bm != BlockMask::all) f(j0, j1 - j0, bm);
  }
}

/// Key-block entries (rows x keys) that query rows [i0, i0 + n) of batch row b compute with key
/// blocks of `block` keys: the work of one query block, for ordering the work items.
int64_t visible_keys(const Mask& mk, int64_t block, int64_t b, int64_t i0, int64_t n) {
  int64_t keys = 0;
  for_each_key_block(mk, block, b, i0, n, [&](int64_t, int64_t nb, BlockMask) { keys += nb; });
  return n * keys;
}

/// The work items 0 .. items - 1 in decreasing order of cost(item), ties in index order. The
/// parallel loops hand them out in this order (schedule(dynamic)), so the last ones taken are
/// the small ones (the causal mask's early query blocks) and a thread that finishes first waits
/// at most a small item; a thread slowed by another tenant of the machine takes fewer. By shape
/// only, and each item writes its own outputs: the result depends on neither.
template <class F>
std::vector<int64_t> largest_first(int64_t items, F&& cost) {
  std::vector<int64_t> c(static_cast<size_t>(items)), order(static_cast<size_t>(items));
  for (int64_t it = 0; it < items; ++it) c[it] = cost(it);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return c[a] > c[b]; });
  return order;
}

#if defined(__AVX512F__)
/// The lanes of the 16 columns from c that lie in [lo, hi).
inline __mmask16 lanes_in(int64_t c, int32_t lo, int32_t hi) {
  const __m512i cols = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(c)),
                                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return _mm512_cmpge_epi32_mask(cols, _mm512_set1_epi32(lo)) & _mm512_cmplt_epi32_mask(cols, _mm512_set1_epi32(hi));
}

/// f32 epilogue of the forward's sT = k q^T block (row jj: key j0 + jj, column c: stacked query
/// row c): the causal / window mask (-inf outside the rows [lo, hi) of each key, visible_rows_of_key)
/// and the running column max mb[c] = max(mb[c], sT[jj, c]), so neither needs its own pass.
struct MaskMaxEpilogue {
  static constexpr bool kActive = true;
  const int32_t* lo;  // per key row of the block (masked only when `masked`)
  const int32_t* hi;
  float* mb;
  bool masked;
  __m512 operator()(__m512 v, int64_t jj, int64_t c, const float*, __mmask16 mk) const {
    if (masked)
      v = _mm512_mask_blend_ps(lanes_in(c, lo[jj], hi[jj]), _mm512_set1_ps(-std::numeric_limits<float>::infinity()), v);
    const __m512 m = _mm512_maskz_loadu_ps(mk, mb + c);
    _mm512_mask_storeu_ps(mb + c, mk, _mm512_max_ps(m, v));
    return v;
  }
};
#endif

/// Forward of one work item: the query block [i0, i0 + n) of query heads h0 .. h0 + hpi - 1 of
/// batch row b (kv head hk), online softmax over its key blocks. The scores are computed
/// transposed, sT [nb, rows] = k q^T (rows = hpi * n stacked query-major), so that each query's
/// running max / sum is a lane of the column-wise passes and the probabilities P^T are read in
/// place as the A of acc += P v.
template <class T>
struct ForwardItem {
  const Heads<const T>& Q;
  const Heads<const T>& K;
  const Heads<const T>& V;
  const Heads<T>& O;
  T* pl;  // lse [B, Hq, T] contiguous
  const Mask& mk;
  int64_t Hq, T_, S, D, Dv;
  T sc;

  void run(int64_t b, int64_t h0, int64_t hpi, int64_t hk, int64_t i0, int64_t n, Buffer<T>& buf,
           Buffer<int32_t>& kmask) const {
    const T ninf = -std::numeric_limits<T>::infinity();
    const int64_t rows = hpi * n, nbmax = std::min<int64_t>(kBlockKForward, S);
    T* qt = buf.get(D * rows + nbmax * rows + rows * Dv + 5 * rows);
    T *st = qt + D * rows, *acc = st + nbmax * rows, *m = acc + rows * Dv, *l = m + rows, *shift = l + rows;
    T *alpha = shift + rows, *mb = alpha + rows;
    stack_rows<T>(Q, b, h0, hpi, i0, n, D, sc, nullptr, qt);  // (q * scale)^T
    std::fill(m, m + rows, ninf);
    std::fill(l, l + rows, T(0));
    bool first = true;
    for_each_key_block(mk, kBlockKForward, b, i0, n, [&](int64_t j0, int64_t nb, BlockMask bm) {
      std::copy(m, m + rows, mb);
      const T* kb = K.at(b, hk, j0);
      const int32_t* key_rows = nullptr;  // [lo | hi] of each key's visible rows when masked (f32 path)
      bool done = false;  // scores, mask and column max in one pass (f32, AVX-512, no documents)
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, float>) {
        if (!mk.q_doc) {
          int32_t* lo = kmask.get(2 * nb);
          for (int64_t jj = 0; jj < nb; ++jj) {
            int64_t a, z;
            visible_rows_of_key(mk, j0 + jj, i0, hpi, rows, a, z);
            lo[jj] = static_cast<int32_t>(a);
            lo[nb + jj] = static_cast<int32_t>(std::max(a, z));
          }
          const bool masked = bm == BlockMask::partial;
          cpu::attention::RowRanges cols{lo, lo + nb, rows, D, false, true, ninf};
          if (masked)
            cpu::attention::block_gemm(nb, rows, D, kb, K.sl, 1, qt, rows, st, rows, false,
                                       MaskMaxEpilogue{lo, lo + nb, mb, true}, cols);
          else
            cpu::attention::block_gemm(nb, rows, D, kb, K.sl, 1, qt, rows, st, rows, false,
                                       MaskMaxEpilogue{lo, lo + nb, mb, false});
          key_rows = masked ? lo : nullptr;
          done = true;
        }
      }
#endif
      if (!done) {
        block_mm<T>(nb, rows, D, kb, K.sl, 1, qt, rows, 1, st, false);  // sT = k (q * scale)^T
        for (int64_t jj = 0; jj < nb; ++jj) {
          T* srow = st + jj * rows;
          if (bm == BlockMask::partial) mask_key_row(srow, b, j0 + jj, i0, hpi, rows);
          Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> mv(mb, rows);
          mv = mv.max(Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(srow, rows));
        }
      }
      for (int64_t c = 0; c < rows; ++c) {  // new max, rescale of the old terms
        shift[c] = mb[c] == ninf ? T(0) : mb[c];  // nothing visible yet: exp(-inf - 0) = 0
        alpha[c] = first ? T(0) : std::exp(m[c] - shift[c]);
        m[c] = mb[c];
        l[c] *= alpha[c];
      }
      for (int64_t jj = 0; jj < nb; ++jj) {  // P^T = exp(sT - shift); masked entries 0
        T* srow = st + jj * rows;
        const int64_t lo = key_rows ? key_rows[jj] : 0, hi = key_rows ? key_rows[nb + jj] : rows;
        std::fill(srow, srow + lo, T(0));
        std::fill(srow + std::max(lo, hi), srow + rows, T(0));
        if (hi > lo) exp_sub_accumulate(srow + lo, shift + lo, srow + lo, l + lo, hi - lo);
      }
      if (!first)
        for (int64_t c = 0; c < rows; ++c)
          for (int64_t d = 0; d < Dv; ++d) acc[c * Dv + d] *= alpha[c];
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, float>) {
        if (key_rows) {  // acc (+)= P v over the keys each row tile may see
          cpu::attention::block_gemm(rows, Dv, nb, st, 1, rows, V.at(b, hk, j0), V.sl, acc, Dv, !first,
                                     cpu::attention::NoEpilogue{},
                                     cpu::attention::ColumnRanges{key_rows, key_rows + nb, nb, Dv});
          first = false;
          return;
        }
      }
#endif
      block_mm<T>(rows, Dv, nb, st, 1, rows, V.at(b, hk, j0), V.sl, 1, acc, !first);  // acc (+)= P v
      first = false;
    });
    for (int64_t c = 0; c < rows; ++c) {
      const int64_t r = c / hpi, h = h0 + c % hpi;
      T* o = O.at(b, h, i0 + r);
      T& lse = pl[(b * Hq + h) * T_ + i0 + r];
      if (!first && l[c] > 0) {
        const T inv = T(1) / l[c];
        for (int64_t d = 0; d < Dv; ++d) o[d] = acc[c * Dv + d] * inv;
        lse = m[c] + std::log(l[c]);
      } else {
        std::fill(o, o + Dv, T(0));
        lse = ninf;
      }
    }
  }

  /// Sets the entries of key j's row of sT (stacked rows of queries from i0) that the mask hides
  /// to -inf.
  void mask_key_row(T* srow, int64_t b, int64_t j, int64_t i0, int64_t hpi, int64_t rows) const {
    const T ninf = -std::numeric_limits<T>::infinity();
    int64_t lo, hi;
    visible_rows_of_key(mk, j, i0, hpi, rows, lo, hi);
    hi = std::max(lo, hi);
    std::fill(srow, srow + lo, ninf);
    std::fill(srow + hi, srow + rows, ninf);
    if (mk.q_doc) {
      const int64_t kd = mk.k_doc[b * S + j];
      const int64_t* qd = mk.q_doc + b * T_ + i0;
      for (int64_t c = lo; c < hi; ++c)
        if (qd[c / hpi] != kd) srow[c] = ninf;
    }
  }
};

template <class T>
void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse, const Mask& mk,
                  double scale) {
  const int64_t B = q.size(0), Hq = q.size(1), T_ = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), Dv = v.size(3), group = Hkv > 0 ? Hq / Hkv : 1;  // 0 heads: empty shard
  const int64_t nqb = (T_ + kBlockQ - 1) / kBlockQ;
  const Heads<const T> Q(q), K(k), V(v);
  const Heads<T> O(out);
  const int64_t hpi = forward_heads_per_item(group, B * Hkv * nqb), subgroups = Hq / hpi;
  const int64_t items = B * subgroups * nqb;  // (batch row, hpi query heads of one kv head, query block)
  const std::vector<int64_t> order = largest_first(items, [&](int64_t it) {
    const int64_t i0 = it % nqb * kBlockQ;
    return visible_keys(mk, kBlockKForward, it / (nqb * subgroups), i0, std::min(T_, i0 + kBlockQ) - i0);
  });
#pragma omp parallel if (items > 1 && B * Hq * T_ * S * D >= cpu::kParallelGrain)
  {
    Buffer<T>& buf = scratch<T>(0);
    Buffer<int32_t>& kmask = scratch<int32_t>(0);
    const ForwardItem<T> item{Q, K, V, O, static_cast<T*>(lse.data_ptr()), mk, Hq, T_, S, D, Dv, static_cast<T>(scale)};
#pragma omp for schedule(dynamic)
    for (int64_t idx = 0; idx < items; ++idx) {
      const int64_t it = order[idx];
      const int64_t qb = it % nqb, h0 = (it / nqb) % subgroups * hpi, b = it / (nqb * subgroups), hk = h0 / group;
      const int64_t i0 = qb * kBlockQ, n = std::min(T_, i0 + kBlockQ) - i0;
      item.run(b, h0, hpi, hk, i0, n, buf, kmask);
    }
  }
}

/// The mask of an sdpa / sdpa_backward call: attrs {is_causal, scale[, window[, diagonal]]}
/// (window 0 and diagonal S - T when absent), document ids at inputs doc0, doc0 + 1 when present
/// (`ids` keeps their contiguous i64 copies alive).
Mask sdpa_mask(const OpCall& c, size_t doc0, int64_t T, int64_t S, Tensor (&ids)[2]) {
  Mask mk{c.b(0), c.attrs.size() > 2 ? c.i(2) : 0, c.attrs.size() > 3 ? c.i(3) : S - T, nullptr, nullptr, T, S};
  if (c.inputs.size() > doc0 + 1 && c.inputs[doc0].defined()) {
    for (int j = 0; j < 2; ++j) {
      ids[j] = contiguous(c.inputs[doc0 + j].detach());
      DTR_CHECK(ids[j].dtype() == DType::i64, "sdpa: document ids must be int64, got ", ids[j].dtype());
    }
    mk.q_doc = static_cast<const int64_t*>(ids[0].data_ptr());
    mk.k_doc = static_cast<const int64_t*>(ids[1].data_ptr());
  }
  return mk;
}

std::vector<Tensor> k_sdpa(const OpCall& c) {
  const DType in_dt = c.inputs[0].dtype();
  const DType dt = is_low_precision(in_dt) ? DType::f32 : in_dt;
  Tensor q = prepared(c.inputs[0], dt), k = prepared(c.inputs[1], dt), v = prepared(c.inputs[2], dt);
  Tensor out = transpose(empty({q.size(0), q.size(2), q.size(1), v.size(3)}, TensorOptions(dt)), 1, 2);
  Tensor lse = empty({q.size(0), q.size(1), q.size(2)}, TensorOptions(dt));
  Tensor ids[2];
  const Mask mk = sdpa_mask(c, 3, q.size(2), k.size(2), ids);
  cpu::dispatch_floating(dt, "sdpa", [&](auto tag) { sdpa_forward<decltype(tag)>(q, k, v, out, lse, mk, c.f(1)); });
  if (dt != in_dt) out = to_dtype(out, in_dt);
  return {out, lse};
}

/// sdpa_backward splits the query blocks of a kv head over up to kMaxBackwardSplit work items
/// (each with its own dk / dv accumulators, added in a fixed order at the end) while there are
/// fewer than kMinBackwardItems items: one item per kv head left a thread idle (Gemma 3: one kv
/// head) and let each block product start its own parallel region. Decided by the shape only, so
/// the result does not depend on the thread count.
constexpr int64_t kMinBackwardItems = 8;
constexpr int64_t kMaxBackwardSplit = 4;

/// Query chunks per kv head: none (1) with kMinBackwardItems kv items or more, else the fewest
/// that give that many items, rounded up so that the items are a multiple of 4 (9 equal items on
/// 2 threads wait 1 / 9 of the work for the last: SmolLM2's 3 kv heads at batch 1 get 4 chunks,
/// 12 items), at most kMaxBackwardSplit and the query blocks. By shape only.
int64_t backward_split(int64_t kv_items, int64_t nqb) {
  if (kv_items == 0) return 1;
  const int64_t cap = std::clamp<int64_t>(nqb, 1, kMaxBackwardSplit);
  int64_t split = std::clamp<int64_t>((kMinBackwardItems + kv_items - 1) / kv_items, 1, cap);
  if (split > 1)
    while (split < cap && kv_items * split % 4 != 0) ++split;
  return split;
}

/// The item (of `split`) that takes query block qb: 0, 1, .., split - 1, split - 1, .., 0, 0, 1, ..
/// (causal: later blocks see more keys, so each item gets early and late ones).
int64_t query_chunk(int64_t qb, int64_t split) {
  const int64_t p = qb % (2 * split);
  return p < split ? p : 2 * split - 1 - p;
}

#if defined(__AVX512F__)
/// f32 epilogue of the backward's s = q k^T block: P = exp(s - lse[i]) on the keys [lo[i], hi[i])
/// of row i (the causal / window mask; lo = hi = 0 for a row without keys), 0 elsewhere.
struct ProbabilityEpilogue {
  static constexpr bool kActive = true;
  const float* lse;
  const int32_t* lo;
  const int32_t* hi;
  __m512 operator()(__m512 v, int64_t i, int64_t j, const float*, __mmask16) const {
    return _mm512_maskz_mov_ps(lanes_in(j, lo[i], hi[i]), cpu::vec::detail::exp_packet(v, _mm512_set1_ps(lse[i])));
  }
};

/// f32 epilogue of the backward's dP = g v^T block written over P: dS = P (dP - di[i]).
struct DsEpilogue {
  static constexpr bool kActive = true;
  const float* di;
  __m512 operator()(__m512 v, int64_t i, int64_t, const float* c, __mmask16 mk) const {
    return _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, c), _mm512_sub_ps(v, _mm512_set1_ps(di[i])));
  }
};
#endif

/// Backward of one query block [i0, i0 + n) of the query heads of kv head hk (batch row b):
/// dq of its rows and the dk / dv terms of its key blocks (added to dK / dV: row-major with row
/// strides ldk / ldv, the output's rows or a buffer). Rows stacked query-major (stack_rows); per
/// key block, with the scores s [rows, nb] row-major: s = (q * scale) k^T, P = exp(s - lse),
/// dv += P^T g, dP = g v^T, dS = P (dP - di), dk += dS^T (q * scale), dq += dS k. Every B operand
/// has unit stride (k^T and v^T from transposed_head, g, q and k rows); the A operands are read
/// in place with their strides (P^T, dS^T column-major).
template <class T>
struct BackwardBlock {
  const Heads<const T>& Q;
  const Heads<const T>& K;
  const Heads<const T>& G;
  const Heads<const T>& O;
  const Heads<T>& dQ;
  const T* pl;  // lse
  int64_t lsb, lsh, lst;
  const Mask& mk;
  int64_t T_, S, D, Dv, group;
  T sc;

  void run(int64_t b, int64_t hk, int64_t i0, int64_t n, const T* kt, const T* vt, T* dK, int64_t ldk, T* dV,
           int64_t ldv, Buffer<T>& buf, Buffer<int32_t>& rmask) const {
    const int64_t rows = group * n, nbmax = std::min<int64_t>(kBlockKBackward, S), h0 = hk * group;
#if defined(__AVX512F__)
    const int64_t dp_len = std::is_same_v<T, float> ? 0 : rows * nbmax;  // the tiles write dS over P
#else
    const int64_t dp_len = rows * nbmax;
#endif
    T* qs = buf.get(rows * D + rows * Dv + rows * nbmax + dp_len + rows * D + 2 * rows);
    T *gs = qs + rows * D, *s = gs + rows * Dv, *dp = s + rows * nbmax;
    T *dqb = dp + dp_len, *di = dqb + rows * D, *lrow = di + rows;
    stack_rows<T>(Q, b, h0, group, i0, n, D, sc, qs, nullptr);  // q * scale
    stack_rows<T>(G, b, h0, group, i0, n, Dv, T(1), gs, nullptr);
    for (int64_t c = 0; c < rows; ++c) {
      const int64_t r = c / group, h = h0 + c % group;
      using Vec = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>;
      di[c] = Vec(gs + c * Dv, Dv).dot(Vec(O.at(b, h, i0 + r), Dv));  // rowsum(dO * O)
      lrow[c] = pl[b * lsb + h * lsh + (i0 + r) * lst];
    }
    const int64_t ldt = transposed_ld(S);
    bool first = true;
    for_each_key_block(mk, kBlockKBackward, b, i0, n, [&](int64_t j0, int64_t nb, BlockMask bm) {
#if defined(__AVX512F__)  // f32: P and dS in the products' epilogues, the mask's zeros skipped
      if constexpr (std::is_same_v<T, float>) {
        // Keys [lo, hi) of each row: elo / ehi for P (empty for a row without keys), blo / bhi
        // (the mask's ranges, nondecreasing in the row) for the products' bounds.
        int32_t* elo = rmask.get(4 * rows);
        int32_t *ehi = elo + rows, *blo = ehi + rows, *bhi = blo + rows;
        for (int64_t c = 0; c < rows; ++c) {
          int64_t a = 0, z = nb;
          if (bm == BlockMask::partial) visible_keys_of_query(mk, i0 + c / group, j0, nb, a, z);
          blo[c] = static_cast<int32_t>(a);
          bhi[c] = static_cast<int32_t>(std::max(a, z));
          if (lrow[c] == -std::numeric_limits<T>::infinity() || a >= z) a = z = 0;
          elo[c] = static_cast<int32_t>(a);
          ehi[c] = static_cast<int32_t>(z);
        }
        namespace att = cpu::attention;
        att::block_gemm(rows, nb, D, qs, D, 1, kt + j0, ldt, s, nb, false, ProbabilityEpilogue{lrow, elo, ehi},
                        att::RowRanges{blo, bhi, nb, D, false, true, 0.0f});  // P = exp((q * scale) k^T - lse)
        if (bm == BlockMask::partial && mk.q_doc) zero_other_documents(s, b, i0, j0, nb, rows);
        att::block_gemm(nb, Dv, rows, s, 1, nb, gs, Dv, dV + j0 * ldv, ldv, true, att::NoEpilogue{},
                        att::ColumnRanges{blo, bhi, rows, Dv});  // dv += P^T g
        att::block_gemm(rows, nb, Dv, gs, Dv, 1, vt + j0, ldt, s, nb, false, DsEpilogue{di},
                        att::RowRanges{blo, bhi, nb, Dv});  // s = dS = P (g v^T - di)
        att::block_gemm(nb, D, rows, s, 1, nb, qs, D, dK + j0 * ldk, ldk, true, att::NoEpilogue{},
                        att::ColumnRanges{blo, bhi, rows, D});  // dk += dS^T (q * scale)
        att::block_gemm(rows, D, nb, s, nb, 1, K.at(b, hk, j0), K.sl, dqb, D, !first, att::NoEpilogue{},
                        att::RowRanges{blo, bhi, D, nb, true});  // dq (+)= dS k (scaled below)
        first = false;
        return;
      }
#endif
      {
        block_mm<T>(rows, nb, D, qs, D, 1, kt + j0, ldt, 1, s, false);  // s = (q * scale) k^T
        for (int64_t c = 0; c < rows; ++c) probabilities(s + c * nb, b, i0 + c / group, j0, nb, bm, lrow[c]);
        block_mm<T>(nb, Dv, rows, s, 1, nb, gs, Dv, 1, dV + j0 * ldv, true);  // dv += P^T g (ldv == Dv here)
        block_mm<T>(rows, nb, Dv, gs, Dv, 1, vt + j0, ldt, 1, dp, false);    // dP = g v^T
        for (int64_t c = 0; c < rows; ++c) {                                 // s = dS = P (dP - di)
          T* sr = s + c * nb;
          const T* dr = dp + c * nb;
          const T dc = di[c];
          for (int64_t j = 0; j < nb; ++j) sr[j] *= dr[j] - dc;
        }
      }
      block_mm<T>(nb, D, rows, s, 1, nb, qs, D, 1, dK + j0 * ldk, true);          // dk += dS^T (q * scale)
      block_mm<T>(rows, D, nb, s, nb, 1, K.at(b, hk, j0), K.sl, 1, dqb, !first);  // dq (+)= dS k (scaled below)
      first = false;
    });
    for (int64_t c = 0; c < rows; ++c) {
      T* dq = dQ.at(b, h0 + c % group, i0 + c / group);
      for (int64_t d = 0; d < D; ++d) dq[d] = first ? T(0) : dqb[c * D + d] * sc;
    }
  }

  /// Zeroes the entries of the P block [rows, nb] (row c: query i0 + c / group, keys from j0) whose
  /// key is in another document than the query.
  void zero_other_documents(T* s, int64_t b, int64_t i0, int64_t j0, int64_t nb, int64_t rows) const {
    const int64_t* kd = mk.k_doc + b * S + j0;
    for (int64_t c = 0; c < rows; ++c) {
      const int64_t qd = mk.q_doc[b * T_ + i0 + c / group];
      for (int64_t j = 0; j < nb; ++j)
        if (kd[j] != qd) s[c * nb + j] = T(0);
    }
  }

  /// The score row s [nb] of query i against keys [j0, j0 + nb) -> P = exp(s - lse), 0 where the
  /// mask hides the key (checked when the block is partial) or the query sees no key (lse -inf).
  void probabilities(T* s, int64_t b, int64_t i, int64_t j0, int64_t nb, BlockMask bm, T lse) const {
    int64_t lo = 0, hi = nb;
    if (bm == BlockMask::partial) visible_keys_of_query(mk, i, j0, nb, lo, hi);
    if (lse == -std::numeric_limits<T>::infinity() || lo >= hi) {
      std::fill(s, s + nb, T(0));
      return;
    }
    std::fill(s, s + lo, T(0));
    std::fill(s + hi, s + nb, T(0));
    exp_shift_inplace(s + lo, lse, hi - lo);
    if (bm == BlockMask::partial && mk.q_doc) {
      const int64_t qd = mk.q_doc[b * T_ + i];
      const int64_t* kd = mk.k_doc + b * S + j0;
      for (int64_t j = lo; j < hi; ++j)
        if (kd[j] != qd) s[j] = T(0);
    }
  }
};

template <class T>
void sdpa_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv, const Mask& mk, double scale) {
  const int64_t B = q.size(0), Hq = q.size(1), T_ = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), Dv = v.size(3), group = Hkv > 0 ? Hq / Hkv : 1;  // 0 heads: empty shard
  const Heads<const T> Q(q), K(k), V(v), G(g), O(o);
  const Heads<T> dQh(dq), dKh(dk), dVh(dv);
  // dk / dv of a kv head are accumulated over its query blocks by the block products: in place
  // (f32 AVX-512 tiles: any row stride; cpu::gemm: row stride D / Dv), else in a buffer of the
  // work item copied out at its end.
#if defined(__AVX512F__)
  constexpr bool any_stride = std::is_same_v<T, float>;
#else
  constexpr bool any_stride = false;
#endif
  const bool dk_direct = any_stride || dk.stride(2) == D, dv_direct = any_stride || dv.stride(2) == Dv;
  const BackwardBlock<T> block{Q, K, G, O, dQh, static_cast<const T*>(lse.data_ptr()), lse.stride(0), lse.stride(1),
                               lse.stride(2), mk, T_, S, D, Dv, group, static_cast<T>(scale)};
  const int64_t kv_items = B * Hkv, nqb = (T_ + kBlockQ - 1) / kBlockQ;
  const int64_t split = backward_split(kv_items, nqb);
  const int64_t items = kv_items * split;  // (batch row, kv head, query chunk)
  // dk / dv of the items r > 0 of each kv head, [kv item * (split - 1) + r - 1]
  std::vector<Mat<T>> part_dk(static_cast<size_t>(kv_items * (split - 1))), part_dv(part_dk.size());
  const std::vector<int64_t> order = largest_first(items, [&](int64_t it) {
    int64_t keys = 0;
    for (int64_t i0 = 0; i0 < T_; i0 += kBlockQ)
      if (query_chunk(i0 / kBlockQ, split) == it % split)
        keys += visible_keys(mk, kBlockKBackward, it / split / Hkv, i0, std::min(T_, i0 + kBlockQ) - i0);
    return keys;
  });
  // k^T, v^T of every kv head ([kv item][D + Dv][transposed_ld(S)]), read by all the items: below
  // the CPU allocator's cached size (cpu_allocator.h, 1 MiB: fresh pages every call) in the
  // calling thread's scratch slot 1 (the workers use slots 0, 2, 3), else a tensor (a cached
  // block, freed after the call: a large batch keeps no scratch of that size).
  const int64_t kvt_len = kv_items * (D + Dv) * transposed_ld(S);
  Tensor kvt_big;
  T* kvt = nullptr;
  if (kvt_len * static_cast<int64_t>(sizeof(T)) < static_cast<int64_t>(kCpuCacheMinBytes)) {
    kvt = scratch<T>(1).get(kvt_len);
  } else {
    kvt_big = empty({kvt_len}, TensorOptions(q.dtype()));
    kvt = static_cast<T*>(kvt_big.data_ptr());
  }
#pragma omp parallel for schedule(static) if (kv_items > 1 && kv_items * S * D >= cpu::kParallelGrain)
  for (int64_t kvi = 0; kvi < kv_items; ++kvi) {
    T* kt = kvt + kvi * (D + Dv) * transposed_ld(S);
    transposed_head(K, kvi / Hkv, kvi % Hkv, S, D, kt);
    transposed_head(V, kvi / Hkv, kvi % Hkv, S, Dv, kt + D * transposed_ld(S));
  }
  auto part = [&](std::vector<Mat<T>>& parts, int64_t kvi, int64_t r, int64_t cols) {  // chunk r > 0's buffer
    Mat<T>& m = parts[kvi * (split - 1) + r - 1];
    m.resize(S, cols);
    return m.data();
  };
#pragma omp parallel if (items > 1 && B * Hq * T_ * S * D >= cpu::kParallelGrain)
  {
    Buffer<T>&buf = scratch<T>(0), &own_dk = scratch<T>(2), &own_dv = scratch<T>(3);
    Buffer<int32_t>& rmask = scratch<int32_t>(0);
#pragma omp for schedule(dynamic)
    for (int64_t idx = 0; idx < items; ++idx) {
      const int64_t it = order[idx];
      const int64_t kvi = it / split, r = it % split, b = kvi / Hkv, hk = kvi % Hkv;
      const bool k_out = r == 0 && dk_direct, v_out = r == 0 && dv_direct;  // accumulate in the output
      T* dK = k_out ? dKh.at(b, hk, 0) : r == 0 ? own_dk.get(S * D) : part(part_dk, kvi, r, D);
      T* dV = v_out ? dVh.at(b, hk, 0) : r == 0 ? own_dv.get(S * Dv) : part(part_dv, kvi, r, Dv);
      const int64_t ldk = k_out ? dKh.sl : D, ldv = v_out ? dVh.sl : Dv;
      for (int64_t j = 0; j < S; ++j) {
        std::fill(dK + j * ldk, dK + j * ldk + D, T(0));
        std::fill(dV + j * ldv, dV + j * ldv + Dv, T(0));
      }
      const T* ktb = kvt + kvi * (D + Dv) * transposed_ld(S);
      const T* vtb = ktb + D * transposed_ld(S);
      for (int64_t i0 = 0; i0 < T_; i0 += kBlockQ)
        if (query_chunk(i0 / kBlockQ, split) == r) block.run(b, hk, i0, std::min(T_, i0 + kBlockQ) - i0, ktb, vtb, dK, ldk, dV, ldv, buf, rmask);
      if (r == 0 && !dk_direct) MMap<T>(dKh.at(b, hk, 0), S, D, Eigen::OuterStride<>(dKh.sl)) = CMap<T>(dK, S, D, Eigen::OuterStride<>(D));
      if (r == 0 && !dv_direct) MMap<T>(dVh.at(b, hk, 0), S, Dv, Eigen::OuterStride<>(dVh.sl)) = CMap<T>(dV, S, Dv, Eigen::OuterStride<>(Dv));
    }
  }
  if (split == 1) return;
#pragma omp parallel for schedule(static) if (kv_items > 1 && kv_items * S * D >= cpu::kParallelGrain)
  for (int64_t kvi = 0; kvi < kv_items; ++kvi) {  // the other chunks' dk / dv, in chunk order
    const int64_t b = kvi / Hkv, hk = kvi % Hkv;
    MMap<T> dK(dKh.at(b, hk, 0), S, D, Eigen::OuterStride<>(dKh.sl));
    MMap<T> dV(dVh.at(b, hk, 0), S, Dv, Eigen::OuterStride<>(dVh.sl));
    for (int64_t r = 1; r < split; ++r) {
      dK += part_dk[kvi * (split - 1) + r - 1];
      dV += part_dv[kvi * (split - 1) + r - 1];
    }
  }
}

/// inputs {g, q, k, v, out, lse[, q_document_ids, k_document_ids]}, attrs {is_causal, scale[, window[,
/// diagonal]]} -> {dq, dk, dv}.
std::vector<Tensor> k_sdpa_backward(const OpCall& c) {
  const DType dt = c.inputs[1].dtype();
  Tensor g = prepared(c.inputs[0], dt), q = prepared(c.inputs[1], dt), k = prepared(c.inputs[2], dt);
  Tensor v = prepared(c.inputs[3], dt), o = prepared(c.inputs[4], dt), lse = c.inputs[5].detach();
  if (lse.dtype() != dt) lse = to_dtype(lse, dt);
  DTR_CHECK(g.sizes() == o.sizes(), "sdpa_backward: gradient ", g.sizes(), " vs output ", o.sizes());
  Tensor dq = cpu::empty_preserve_layout(q, dt), dk = cpu::empty_preserve_layout(k, dt);
  Tensor dv = cpu::empty_preserve_layout(v, dt);
  Tensor ids[2];
  const Mask mk = sdpa_mask(c, 6, q.size(2), k.size(2), ids);
  cpu::dispatch_floating(dt, "sdpa_backward", [&](auto tag) {
    sdpa_backward<decltype(tag)>(g, q, k, v, o, lse, dq, dk, dv, mk, c.f(1));
  });
  return {dq, dk, dv};
}

DTR_REGISTER_KERNEL_EXACT("sdpa", DeviceType::CPU, k_sdpa);
DTR_REGISTER_KERNEL("sdpa_backward", DeviceType::CPU, k_sdpa_backward);

}  // namespace
}  // namespace dtr
