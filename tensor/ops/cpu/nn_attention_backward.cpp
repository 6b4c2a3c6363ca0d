// CPU kernel of sdpa_backward (f32 / f64): Flash-attention 2 backward over blocks of 64 stacked
// queries x 128 keys, work items of (batch row, kv head[, query chunk]) (see nn_attention_common.h).
#include "tensor/ops/cpu/nn_attention_common.h"
#include "tensor/ops/cpu/nn_attention_split.h"

namespace dtr {
namespace {

using namespace cpu::attention;

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
#if defined(__AVX512F__)
  /// f32 with AVX-512: P and dS in the products' epilogues (the mask's zeros skipped), dS
  /// written over P, so no dP buffer.
  static constexpr bool kFused = std::is_same_v<T, float>;
#else
  static constexpr bool kFused = false;
#endif
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
    const int64_t dp_len = kFused ? 0 : rows * nbmax;  // fused: the tiles write dS over P, no dP
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
      if constexpr (kFused) {
#if defined(__AVX512F__)
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
#endif
      } else {
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
        block_mm<T>(nb, D, rows, s, 1, nb, qs, D, 1, dK + j0 * ldk, true);          // dk += dS^T (q * scale)
        block_mm<T>(rows, D, nb, s, nb, 1, K.at(b, hk, j0), K.sl, 1, dqb, !first);  // dq (+)= dS k (scaled below)
      }
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
        if (query_chunk(i0 / kBlockQ, split) == r)
          block.run(b, hk, i0, std::min(T_, i0 + kBlockQ) - i0, ktb, vtb, dK, ldk, dV, ldv, buf, rmask);
      if (r == 0 && !dk_direct)
        MMap<T>(dKh.at(b, hk, 0), S, D, Eigen::OuterStride<>(dKh.sl)) = CMap<T>(dK, S, D, Eigen::OuterStride<>(D));
      if (r == 0 && !dv_direct)
        MMap<T>(dVh.at(b, hk, 0), S, Dv, Eigen::OuterStride<>(dVh.sl)) = CMap<T>(dV, S, Dv, Eigen::OuterStride<>(Dv));
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

DTR_REGISTER_KERNEL("sdpa_backward", DeviceType::CPU, k_sdpa_backward);

}  // namespace
}  // namespace dtr
