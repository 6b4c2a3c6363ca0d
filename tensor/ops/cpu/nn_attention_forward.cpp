// CPU kernel of sdpa (f32 / f64; bf16 / f16 computed in f32): Flash-attention forward with an
// online softmax over blocks of 64 stacked queries x 256 keys (see nn_attention_common.h).
#include "tensor/ops/cpu/nn_attention_common.h"

namespace dtr {
namespace {

using namespace cpu::attention;

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

#if defined(__AVX512F__)
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

DTR_REGISTER_KERNEL_EXACT("sdpa", DeviceType::CPU, k_sdpa);

}  // namespace
}  // namespace dtr
