// CPU kernels of sdpa (Flash-attention forward with online softmax) and sdpa_backward
// (Flash-attention 2 backward), blocks of 64 queries (per head of a GQA group) x 256 keys
// (forward) / 128 keys (backward), block products through cpu::gemm (f32: dtr's SGEMM; f64:
// Eigen). f32 blocks take exp through Eigen's vectorised packet math; f64 keeps the scalar std::exp.
// Masks (see Mask): causal with a diagonal offset, sliding window, document ids; a score block the
// mask hides entirely (past the diagonal, before the window, or without a document in common:
// the min / max document ids of its rows and keys do not overlap) is skipped.
// GQA: the query blocks of the heads that share a kv head are stacked (stack_queries), so each
// block product runs once per kv head with group x 64 rows and packs each K / V block once.
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
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/gemm.h"
#include "tensor/ops/cpu/layout.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/vec.h"

namespace dtr {
namespace {

constexpr int64_t kBlockQ = 64;
// Keys per block: 256 in the forward (at T = 256 one block per query block, no rescaling of the
// accumulator; single-thread A/B at [4, 9/3, 256, 64]: median 6.69 -> 6.35 ms vs 128), 128 in the
// backward (256 was no faster there and doubles its two score buffers).
constexpr int64_t kBlockKForward = 256;
constexpr int64_t kBlockKBackward = 128;

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using CMap = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MMap = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;

/// C[m, n] (+)= A[m, k] B[k, n] with element strides (rows, columns) of A and B; C contiguous
/// with row stride n. f32 through dtr's GEMM (cpu/gemm.h: serial inside the work items' parallel
/// loop), f64 through Eigen.
template <class T>
void block_mm(int64_t m, int64_t n, int64_t k, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
              int64_t b_cs, T* C, bool acc) {
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

/// Sets masked entries of the score block of batch row b (`rows` queries from i0 x `cols` keys
/// from j0, row-major with row stride cols) to -inf: keys j > i + off (causal), with a sliding
/// window keys j <= i + off - window (a query sees itself and the window - 1 keys before it), and
/// keys of another document.
template <class T>
void apply_mask(T* sp, int64_t rows, int64_t cols, const Mask& mk, int64_t b, int64_t i0, int64_t j0) {
  const T ninf = -std::numeric_limits<T>::infinity();
  MMap<T> s(sp, rows, cols, Eigen::OuterStride<>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t last = i0 + r + mk.off;  // last visible key of this row
    if (mk.causal)
      for (int64_t cidx = std::max<int64_t>(0, last - j0 + 1); cidx < cols; ++cidx) s(r, cidx) = ninf;
    if (mk.window > 0)
      for (int64_t cidx = 0; cidx < std::min<int64_t>(cols, last - mk.window - j0 + 1); ++cidx) s(r, cidx) = ninf;
    if (mk.q_doc) {
      const int64_t d = mk.q_doc[b * mk.T + i0 + r];
      const int64_t* kd = mk.k_doc + b * mk.S + j0;
      for (int64_t cidx = 0; cidx < cols; ++cidx)
        if (kd[cidx] != d) s(r, cidx) = ninf;
    }
  }
}

/// Loads the query blocks [i0, i0 + n) of query heads h0 .. h0 + heads - 1 (sharing one kv
/// head), batch row b, scaled by `sc`, stacked head-major into `qs` [heads * n, D]: row g * n + r
/// is query i0 + r of head h0 + g. Their block products then share each K / V block (one GEMM
/// with heads * n rows instead of `heads` GEMMs that pack the same K / V block again).
template <class T>
void stack_queries(Mat<T>& qs, const Heads<const T>& Q, int64_t b, int64_t h0, int64_t heads, int64_t i0, int64_t n,
                   int64_t D, T sc) {
  qs.resize(heads * n, D);
  for (int64_t g = 0; g < heads; ++g)
    qs.middleRows(g * n, n) = CMap<T>(Q.at(b, h0 + g, i0), n, D, Eigen::OuterStride<>(Q.sl)) * sc;
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

/// The stacked score block s [heads * n, nb] = qs k^T for the keys [j0, j0 + nb) (kb: the first
/// key's row, row stride ks), masked per head when the block is partial.
template <class T>
void score_block(Mat<T>& s, const Mat<T>& qs, const T* kb, int64_t ks, int64_t nb, int64_t heads, int64_t n,
                 BlockMask bm, const Mask& mk, int64_t b, int64_t i0, int64_t j0) {
  const int64_t rows = qs.rows(), D = qs.cols();
  s.resize(rows, nb);
  block_mm<T>(rows, nb, D, qs.data(), D, 1, kb, 1, ks, s.data(), false);  // (q * scale) k^T
  if (bm == BlockMask::partial)
    for (int64_t g = 0; g < heads; ++g) apply_mask(s.data() + g * n * nb, n, nb, mk, b, i0, j0);
}

template <class T>
void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse, const Mask& mk,
                  double scale) {
  const int64_t B = q.size(0), Hq = q.size(1), T_ = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), Dv = v.size(3), group = Hkv > 0 ? Hq / Hkv : 1;  // 0 heads: empty shard
  const int64_t nqb = (T_ + kBlockQ - 1) / kBlockQ;
  const Heads<const T> Q(q), K(k), V(v);
  const Heads<T> O(out);
  T* pl = static_cast<T*>(lse.data_ptr());
  const T ninf = -std::numeric_limits<T>::infinity();
  const T sc = static_cast<T>(scale);
  const int64_t hpi = forward_heads_per_item(group, B * Hkv * nqb), subgroups = Hq / hpi;
  const int64_t items = B * subgroups * nqb;  // (batch row, hpi query heads of one kv head, query block)
  const std::vector<int64_t> order = largest_first(items, [&](int64_t it) {
    const int64_t i0 = it % nqb * kBlockQ;
    return visible_keys(mk, kBlockKForward, it / (nqb * subgroups), i0, std::min(T_, i0 + kBlockQ) - i0);
  });
#pragma omp parallel for schedule(dynamic) if (items > 1 && B * Hq * T_ * S * D >= cpu::kParallelGrain)
  for (int64_t idx = 0; idx < items; ++idx) {
    const int64_t it = order[idx];
    const int64_t qb = it % nqb, h0 = (it / nqb) % subgroups * hpi, b = it / (nqb * subgroups), hk = h0 / group;
    const int64_t i0 = qb * kBlockQ, i1 = std::min(T_, i0 + kBlockQ), n = i1 - i0, rows = hpi * n;
    Mat<T> qs;  // the item's queries, scaled once
    stack_queries(qs, Q, b, h0, hpi, i0, n, D, sc);
    Mat<T> acc = Mat<T>::Zero(rows, Dv);
    Eigen::Matrix<T, Eigen::Dynamic, 1> m = Eigen::Matrix<T, Eigen::Dynamic, 1>::Constant(rows, ninf);
    Eigen::Matrix<T, Eigen::Dynamic, 1> l = Eigen::Matrix<T, Eigen::Dynamic, 1>::Zero(rows);
    Mat<T> s;
    for_each_key_block(mk, kBlockKForward, b, i0, n, [&](int64_t j0, int64_t nb, BlockMask bm) {
      CMap<T> km(K.at(b, hk, j0), nb, D, Eigen::OuterStride<>(K.sl));
      CMap<T> vm(V.at(b, hk, j0), nb, Dv, Eigen::OuterStride<>(V.sl));
      score_block(s, qs, km.data(), K.sl, nb, hpi, n, bm, mk, b, i0, j0);
      for (int64_t r = 0; r < rows; ++r) {
        const T mnew = std::max(m(r), s.row(r).maxCoeff());
        if (mnew == ninf) {  // nothing visible yet in this row
          s.row(r).setZero();
          continue;
        }
        const T alpha = std::exp(m(r) - mnew);  // 0 when m was -inf
        T rowsum = 0;
        if constexpr (std::is_same_v<T, float>) {  // vectorised exp (Eigen packet math)
          cpu::vec::exp_shift(s.data() + r * nb, mnew, 1.0f, s.data() + r * nb, nb);
          rowsum = s.row(r).sum();
        } else {
          for (int64_t cidx = 0; cidx < nb; ++cidx) {
            const T e = std::exp(s(r, cidx) - mnew);
            s(r, cidx) = e;
            rowsum += e;
          }
        }
        l(r) = l(r) * alpha + rowsum;
        acc.row(r) *= alpha;
        m(r) = mnew;
      }
      block_mm<T>(rows, Dv, nb, s.data(), nb, 1, vm.data(), V.sl, 1, acc.data(), true);
    });
    for (int64_t g = 0; g < hpi; ++g) {
      const int64_t h = h0 + g;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t rr = g * n + r, row = (b * Hq + h) * T_ + i0 + r;
        T* o = O.at(b, h, i0 + r);
        if (l(rr) > 0) {
          const T inv = T(1) / l(rr);
          for (int64_t d = 0; d < Dv; ++d) o[d] = acc(rr, d) * inv;
          pl[row] = m(rr) + std::log(l(rr));
        } else {
          std::fill(o, o + Dv, T(0));
          pl[row] = ninf;
        }
      }
    }
  }
}

/// The mask of an sdpa / sdpa_backward call: attrs {is_causal, scale[, window[, diagonal]]}
/// (window 0 and diagonal S - T when absent), document ids at inputs doc0, doc0 + 1 when present
/// (`ids` keeps their contiguous i64 copies alive).
Mask sdpa_mask(const OpCall& c, size_t doc0, int64_t T, int64_t S, Tensor (&ids)[2]) {
  Mask mk{c.b(0), c.attrs.size() > 2 ? c.i(2) : 0, c.attrs.size() > 3 ? c.i(3) : S - T};
  mk.T = T;
  mk.S = S;
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

/// The item (of `split`) that takes query block qb: 0, 1, .., split - 1, split - 1, .., 0, 0, 1, ..
/// (causal: later blocks see more keys, so each item gets early and late ones).
int64_t query_chunk(int64_t qb, int64_t split) {
  const int64_t p = qb % (2 * split);
  return p < split ? p : 2 * split - 1 - p;
}

template <class T>
void sdpa_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv, const Mask& mk, double scale) {
  const int64_t B = q.size(0), Hq = q.size(1), T_ = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), Dv = v.size(3), group = Hkv > 0 ? Hq / Hkv : 1;  // 0 heads: empty shard
  const Heads<const T> Q(q), K(k), V(v), G(g), O(o);
  const Heads<T> dQh(dq), dKh(dk), dVh(dv);
  // dk / dv of a kv head are accumulated over its query blocks by the GEMM, whose C is row-major
  // with row stride D (Dv): in place when the output has that row stride, else in a buffer of
  // the work item copied out at its end.
  const bool dk_direct = dk.stride(2) == D, dv_direct = dv.stride(2) == Dv;
  const T* pl = static_cast<const T*>(lse.data_ptr());
  const int64_t lsb = lse.stride(0), lsh = lse.stride(1), lst = lse.stride(2);
  const T ninf = -std::numeric_limits<T>::infinity();
  const T sc = static_cast<T>(scale);
  const int64_t kv_items = B * Hkv, nqb = (T_ + kBlockQ - 1) / kBlockQ;
  const int64_t split =
      kv_items == 0 ? 1
                    : std::clamp<int64_t>((kMinBackwardItems + kv_items - 1) / kv_items, 1,
                                          std::clamp<int64_t>(nqb, 1, kMaxBackwardSplit));
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
#pragma omp parallel for schedule(dynamic) if (items > 1 && B * Hq * T_ * S * D >= cpu::kParallelGrain)
  for (int64_t idx = 0; idx < items; ++idx) {
    const int64_t it = order[idx];
    const int64_t kvi = it / split, r = it % split, b = kvi / Hkv, hk = kvi % Hkv;
    const bool k_out = r == 0 && dk_direct, v_out = r == 0 && dv_direct;  // accumulate in the output
    Mat<T> dKown, dVown;
    Mat<T>& dKbuf = r == 0 ? dKown : part_dk[kvi * (split - 1) + r - 1];
    Mat<T>& dVbuf = r == 0 ? dVown : part_dv[kvi * (split - 1) + r - 1];
    if (!k_out) dKbuf.resize(S, D);
    if (!v_out) dVbuf.resize(S, Dv);
    MMap<T> dK(k_out ? dKh.at(b, hk, 0) : dKbuf.data(), S, D, Eigen::OuterStride<>(D));
    MMap<T> dV(v_out ? dVh.at(b, hk, 0) : dVbuf.data(), S, Dv, Eigen::OuterStride<>(Dv));
    dK.setZero();
    dV.setZero();
    Mat<T> qs, gs, s, dp, dqb;
    Eigen::Matrix<T, Eigen::Dynamic, 1> lrow, di;
    for (int64_t i0 = 0; i0 < T_; i0 += kBlockQ) {
      if (query_chunk(i0 / kBlockQ, split) != r) continue;
      // The group's query heads stacked head-major (row j * n + r: query i0 + r of head
      // hk * group + j), so each K / V block serves all of them in one product.
      const int64_t i1 = std::min(T_, i0 + kBlockQ), n = i1 - i0, rows = group * n;
      stack_queries(qs, Q, b, hk * group, group, i0, n, D, sc);  // q * scale
      gs.resize(rows, Dv);
      lrow.resize(rows);
      di.resize(rows);
      for (int64_t j = 0; j < group; ++j) {
        const int64_t h = hk * group + j;
        CMap<T> gm(G.at(b, h, i0), n, Dv, Eigen::OuterStride<>(G.sl));
        CMap<T> om(O.at(b, h, i0), n, Dv, Eigen::OuterStride<>(O.sl));
        gs.middleRows(j * n, n) = gm;
        di.segment(j * n, n) = gm.cwiseProduct(om).rowwise().sum();
        for (int64_t r = 0; r < n; ++r) lrow(j * n + r) = pl[b * lsb + h * lsh + (i0 + r) * lst];
      }
      dqb = Mat<T>::Zero(rows, D);
      for_each_key_block(mk, kBlockKBackward, b, i0, n, [&](int64_t j0, int64_t nb, BlockMask bm) {
        CMap<T> km(K.at(b, hk, j0), nb, D, Eigen::OuterStride<>(K.sl));
        CMap<T> vm(V.at(b, hk, j0), nb, Dv, Eigen::OuterStride<>(V.sl));
        score_block(s, qs, km.data(), K.sl, nb, group, n, bm, mk, b, i0, j0);
        for (int64_t r = 0; r < rows; ++r) {  // P = exp(s - lse); masked and key-less rows -> 0
          if (lrow(r) == ninf) {
            s.row(r).setZero();
            continue;
          }
          if constexpr (std::is_same_v<T, float>) {
            cpu::vec::exp_shift(s.data() + r * nb, lrow(r), 1.0f, s.data() + r * nb, nb);
          } else {
            for (int64_t cidx = 0; cidx < nb; ++cidx) s(r, cidx) = std::exp(s(r, cidx) - lrow(r));
          }
        }
        block_mm<T>(nb, Dv, rows, s.data(), 1, nb, gs.data(), Dv, 1, dV.data() + j0 * Dv, true);  // P^T g
        dp.resize(rows, nb);
        block_mm<T>(rows, nb, Dv, gs.data(), Dv, 1, vm.data(), 1, V.sl, dp.data(), false);  // g v^T
        dp.array().colwise() -= di.array();
        s.array() *= dp.array();  // s now holds dS
        block_mm<T>(rows, D, nb, s.data(), nb, 1, km.data(), K.sl, 1, dqb.data(), true);  // dS k (scaled below)
        block_mm<T>(nb, D, rows, s.data(), 1, nb, qs.data(), D, 1, dK.data() + j0 * D, true);  // dS^T (q * scale)
      });
      for (int64_t j = 0; j < group; ++j)
        MMap<T>(dQh.at(b, hk * group + j, i0), n, D, Eigen::OuterStride<>(dQh.sl)) = dqb.middleRows(j * n, n) * sc;
    }
    if (r == 0 && !dk_direct) MMap<T>(dKh.at(b, hk, 0), S, D, Eigen::OuterStride<>(dKh.sl)) = dKbuf;
    if (r == 0 && !dv_direct) MMap<T>(dVh.at(b, hk, 0), S, Dv, Eigen::OuterStride<>(dVh.sl)) = dVbuf;
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
