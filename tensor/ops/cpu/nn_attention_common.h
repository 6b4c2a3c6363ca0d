#pragma once
// The CPU kernels of sdpa (Flash-attention forward with online softmax) and sdpa_backward
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
//
// This header: the pieces both kernels use (block sizes, Heads, Mask and its block / range
// helpers, stacking and transposes, exp helpers, per-thread scratch, the work order, sdpa_mask);
// the forward is nn_attention_forward.cpp, the backward nn_attention_backward.cpp, the block
// products nn_attention_block_gemm.h. Included only by those files (compiled for the kernel arch).
#ifndef EIGEN_DONT_PARALLELIZE
#define EIGEN_DONT_PARALLELIZE
#endif
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
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/nn_attention_block_gemm.h"
#include "tensor/ops/cpu/sgemm_common.h"
#include "tensor/ops/cpu/vec.h"

namespace dtr::cpu::attention {

inline constexpr int64_t kBlockQ = 64;
// Keys per block: 256 in the forward (at T = 256 one block per query block, no rescaling of the
// accumulator), 128 in the backward. Re-measured with the register tiles (in-process A/B, 1
// thread, 2026-12-02): forward 128 keys x0.98 at [4, 9/3, 256, 64] but x1.02-1.07 at
// [1, 9/3, 2048, 64]; backward 64 keys x0.98 and 256 keys x1.00 at both: kept.
inline constexpr int64_t kBlockKForward = 256;
inline constexpr int64_t kBlockKBackward = 128;

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
inline Tensor prepared(const Tensor& t, DType dt) {
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
inline int64_t key_end(const Mask& mk, int64_t i1) {
  if (!mk.causal) return mk.S;
  return std::clamp<int64_t>(i1 + mk.off, 0, mk.S);
}

/// First key any query row >= i0 may see: 0, or i0 + off - window + 1 with a sliding window.
inline int64_t key_begin(const Mask& mk, int64_t i0) {
  if (mk.window <= 0) return 0;
  return std::clamp<int64_t>(i0 + mk.off - mk.window + 1, 0, mk.S);
}

/// Smallest and largest document id of rows [r0, r1) of `ids`.
inline std::pair<int64_t, int64_t> doc_range(const int64_t* ids, int64_t r0, int64_t r1) {
  const auto [lo, hi] = std::minmax_element(ids + r0, ids + r1);
  return {*lo, *hi};
}

/// What the mask does to the score block [i0, i0 + rows) x [j0, j1) of batch row b.
enum class BlockMask { none, partial, all };

inline BlockMask block_mask(const Mask& mk, int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t j1) {
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
inline void visible_keys_of_query(const Mask& mk, int64_t i, int64_t j0, int64_t nb, int64_t& lo, int64_t& hi) {
  lo = 0;
  hi = nb;
  if (mk.causal) hi = std::clamp<int64_t>(i + mk.off + 1 - j0, 0, nb);
  if (mk.window > 0) lo = std::clamp<int64_t>(i + mk.off - mk.window + 1 - j0, 0, nb);
}

/// Stacked rows [lo, hi) of `rows` (row c: query i0 + c / heads) that key j may be seen from
/// under the causal and window parts of the mask (the same rule as visible_keys_of_query).
inline void visible_rows_of_key(const Mask& mk, int64_t j, int64_t i0, int64_t heads, int64_t rows, int64_t& lo,
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
  cpu::sgemm_detail::Scratch s{nullptr, 0, "sdpa"};
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
inline int64_t transposed_ld(int64_t S) { return S + 16; }

/// dst[d * transposed_ld(S) + j] = x[b, h, j, d]: k^T (or v^T) of one (batch row, kv head), so that
/// the block products read k and v with unit stride along the keys for every query block.
template <class T>
void transposed_head(const Heads<const T>& X, int64_t b, int64_t h, int64_t S, int64_t D, T* dst) {
  transpose_rows<T>([&](int64_t j) { return X.at(b, h, j); }, S, D, T(1), dst, transposed_ld(S));
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
inline int64_t visible_keys(const Mask& mk, int64_t block, int64_t b, int64_t i0, int64_t n) {
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

#endif

/// The mask of an sdpa / sdpa_backward call: attrs {is_causal, scale[, window[, diagonal]]}
/// (window 0 and diagonal S - T when absent), document ids at inputs doc0, doc0 + 1 when present
/// (`ids` keeps their contiguous i64 copies alive).
inline Mask sdpa_mask(const OpCall& c, size_t doc0, int64_t T, int64_t S, Tensor (&ids)[2]) {
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

}  // namespace dtr::cpu::attention
