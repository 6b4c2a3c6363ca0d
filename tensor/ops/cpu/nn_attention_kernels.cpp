// CPU kernels of sdpa (Flash-attention forward with online softmax) and sdpa_backward
// (Flash-attention 2 backward), blocks of 64 queries x 128 keys through Eigen (64 x 64 was ~12%
// slower on one core at [4, 9, 256, 64]). f32 blocks take exp through Eigen's vectorised packet
// math; f64 keeps the scalar std::exp.
// Forward work items: (batch, query head, query block), in parallel.
// Backward work items: (batch, kv head), in parallel; each owns its dk/dv rows and the dq rows
// of the query heads in its group, so no accumulation races.
// bf16/f16 inputs are computed in f32 and lse is kept in f32 (registered without the
// dispatcher's upcast so that lse is not rounded to low precision).
#define EIGEN_DONT_PARALLELIZE
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/vec.h"

namespace dtr {
namespace {

constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 128;

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using CMap = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MMap = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;

/// A local tensor whose last dim has stride 1 (copied when not), in compute dtype `dt`.
Tensor prepared(const Tensor& t, DType dt) {
  Tensor x = t.detach();
  if (x.dtype() != dt) x = to_dtype(x, dt);
  if (x.dim() > 0 && x.strides().back() != 1 && x.sizes().back() > 1) x = contiguous(x);
  return x;
}

/// Geometry of a [B, H, L, D] tensor with unit stride in D.
template <class T>
struct Heads {
  const T* p;
  int64_t sb, sh, sl;
  Heads(const Tensor& t) : p(static_cast<const T*>(t.data_ptr())), sb(t.stride(0)), sh(t.stride(1)), sl(t.stride(2)) {}
  const T* at(int64_t b, int64_t h, int64_t l) const { return p + b * sb + h * sh + l * sl; }
};

/// Number of keys any query row in [i0, i1) may see: all S, or i1 - 1 + (S - T) + 1 when causal.
int64_t key_end(bool causal, int64_t i1, int64_t T, int64_t S) {
  if (!causal) return S;
  return std::clamp<int64_t>(i1 + (S - T), 0, S);
}

/// First key any query row >= i0 may see: 0, or i0 + (S - T) - window + 1 with a sliding window.
int64_t key_begin(int64_t window, int64_t i0, int64_t T, int64_t S) {
  if (window <= 0) return 0;
  return std::clamp<int64_t>(i0 + (S - T) - window + 1, 0, S);
}

/// True when some entry of the score block [i0, i0 + rows) x [j0, j1) is masked.
bool block_masked(bool causal, int64_t window, int64_t i0, int64_t rows, int64_t j0, int64_t j1, int64_t T, int64_t S) {
  if (causal && j1 - 1 > i0 + (S - T)) return true;                        // keys after the first row's last
  return window > 0 && j0 <= i0 + rows - 1 + (S - T) - window;            // keys before the last row's first
}

/// Sets masked entries of the score block to -inf: keys j > i + S - T (causal) and, with a sliding
/// window, keys j <= i + S - T - window (a query sees itself and the window - 1 keys before it).
template <class T>
void apply_mask(Mat<T>& s, bool causal, int64_t window, int64_t i0, int64_t j0, int64_t T_, int64_t S) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const int64_t cols = s.cols();
  for (int64_t r = 0; r < s.rows(); ++r) {
    const int64_t last = i0 + r + (S - T_);  // last visible key of this row
    if (causal)
      for (int64_t cidx = std::max<int64_t>(0, last - j0 + 1); cidx < cols; ++cidx) s(r, cidx) = ninf;
    if (window > 0)
      for (int64_t cidx = 0; cidx < std::min<int64_t>(cols, last - window - j0 + 1); ++cidx) s(r, cidx) = ninf;
  }
}

template <class T>
void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse, bool causal, double scale,
                  int64_t window) {
  const int64_t B = q.size(0), Hq = q.size(1), T_ = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), Dv = v.size(3), group = Hkv > 0 ? Hq / Hkv : 1;  // 0 heads: empty shard
  const int64_t nqb = (T_ + kBlockQ - 1) / kBlockQ;
  const Heads<T> Q(q), K(k), V(v);
  T* po = static_cast<T*>(out.data_ptr());
  T* pl = static_cast<T*>(lse.data_ptr());
  const T ninf = -std::numeric_limits<T>::infinity();
  const T sc = static_cast<T>(scale);
  const int64_t items = B * Hq * nqb;
#pragma omp parallel for schedule(dynamic) if (items > 1 && B * Hq * T_ * S * D >= cpu::kParallelGrain)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t qb = it % nqb, h = (it / nqb) % Hq, b = it / (nqb * Hq), hk = h / group;
    const int64_t i0 = qb * kBlockQ, i1 = std::min(T_, i0 + kBlockQ), n = i1 - i0;
    CMap<T> qm(Q.at(b, h, i0), n, D, Eigen::OuterStride<>(Q.sl));
    Mat<T> acc = Mat<T>::Zero(n, Dv);
    Eigen::Matrix<T, Eigen::Dynamic, 1> m = Eigen::Matrix<T, Eigen::Dynamic, 1>::Constant(n, ninf);
    Eigen::Matrix<T, Eigen::Dynamic, 1> l = Eigen::Matrix<T, Eigen::Dynamic, 1>::Zero(n);
    Mat<T> s;
    const int64_t jend = key_end(causal, i1, T_, S);
    for (int64_t j0 = key_begin(window, i0, T_, S); j0 < jend; j0 += kBlockK) {
      const int64_t j1 = std::min(jend, j0 + kBlockK), nb = j1 - j0;
      CMap<T> km(K.at(b, hk, j0), nb, D, Eigen::OuterStride<>(K.sl));
      CMap<T> vm(V.at(b, hk, j0), nb, Dv, Eigen::OuterStride<>(V.sl));
      s.noalias() = (qm * km.transpose()) * sc;
      if (block_masked(causal, window, i0, n, j0, j1, T_, S)) apply_mask(s, causal, window, i0, j0, T_, S);
      for (int64_t r = 0; r < n; ++r) {
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
      acc.noalias() += s * vm;
    }
    for (int64_t r = 0; r < n; ++r) {
      const int64_t row = ((b * Hq + h) * T_ + i0 + r);
      T* o = po + row * Dv;
      if (l(r) > 0) {
        const T inv = T(1) / l(r);
        for (int64_t d = 0; d < Dv; ++d) o[d] = acc(r, d) * inv;
        pl[row] = m(r) + std::log(l(r));
      } else {
        std::fill(o, o + Dv, T(0));
        pl[row] = ninf;
      }
    }
  }
}

/// The sliding window of an sdpa call (attrs {is_causal, scale, window}; 0 = none, also when the
/// attribute is absent).
int64_t sdpa_window(const OpCall& c) { return c.attrs.size() > 2 ? c.i(2) : 0; }

std::vector<Tensor> k_sdpa(const OpCall& c) {
  const DType in_dt = c.inputs[0].dtype();
  const DType dt = is_low_precision(in_dt) ? DType::f32 : in_dt;
  Tensor q = prepared(c.inputs[0], dt), k = prepared(c.inputs[1], dt), v = prepared(c.inputs[2], dt);
  Tensor out = empty({q.size(0), q.size(1), q.size(2), v.size(3)}, TensorOptions(dt));
  Tensor lse = empty({q.size(0), q.size(1), q.size(2)}, TensorOptions(dt));
  cpu::dispatch_floating(dt, "sdpa", [&](auto tag) {
    sdpa_forward<decltype(tag)>(q, k, v, out, lse, c.b(0), c.f(1), sdpa_window(c));
  });
  if (dt != in_dt) out = to_dtype(out, in_dt);
  return {out, lse};
}

template <class T>
void sdpa_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv, bool causal, double scale, int64_t window) {
  const int64_t B = q.size(0), Hq = q.size(1), T_ = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), Dv = v.size(3), group = Hkv > 0 ? Hq / Hkv : 1;  // 0 heads: empty shard
  const Heads<T> Q(q), K(k), V(v), G(g), O(o);
  const T* pl = static_cast<const T*>(lse.data_ptr());
  const int64_t lsb = lse.stride(0), lsh = lse.stride(1), lst = lse.stride(2);
  T* pdq = static_cast<T*>(dq.data_ptr());
  T* pdk = static_cast<T*>(dk.data_ptr());
  T* pdv = static_cast<T*>(dv.data_ptr());
  const T ninf = -std::numeric_limits<T>::infinity();
  const T sc = static_cast<T>(scale);
  const int64_t items = B * Hkv;
#pragma omp parallel for schedule(dynamic) if (items > 1 && B * Hq * T_ * S * D >= cpu::kParallelGrain)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t b = it / Hkv, hk = it % Hkv;
    MMap<T> dK(pdk + (b * Hkv + hk) * S * D, S, D, Eigen::OuterStride<>(D));
    MMap<T> dV(pdv + (b * Hkv + hk) * S * Dv, S, Dv, Eigen::OuterStride<>(Dv));
    dK.setZero();
    dV.setZero();
    Mat<T> s, dp, dqb;
    Eigen::Matrix<T, Eigen::Dynamic, 1> lrow, di;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (int64_t i0 = 0; i0 < T_; i0 += kBlockQ) {
        const int64_t i1 = std::min(T_, i0 + kBlockQ), n = i1 - i0;
        CMap<T> qm(Q.at(b, h, i0), n, D, Eigen::OuterStride<>(Q.sl));
        CMap<T> gm(G.at(b, h, i0), n, Dv, Eigen::OuterStride<>(G.sl));
        CMap<T> om(O.at(b, h, i0), n, Dv, Eigen::OuterStride<>(O.sl));
        lrow.resize(n);
        for (int64_t r = 0; r < n; ++r) lrow(r) = pl[b * lsb + h * lsh + (i0 + r) * lst];
        di = (gm.cwiseProduct(om)).rowwise().sum();
        dqb = Mat<T>::Zero(n, D);
        const int64_t jend = key_end(causal, i1, T_, S);
        for (int64_t j0 = key_begin(window, i0, T_, S); j0 < jend; j0 += kBlockK) {
          const int64_t j1 = std::min(jend, j0 + kBlockK), nb = j1 - j0;
          CMap<T> km(K.at(b, hk, j0), nb, D, Eigen::OuterStride<>(K.sl));
          CMap<T> vm(V.at(b, hk, j0), nb, Dv, Eigen::OuterStride<>(V.sl));
          s.noalias() = (qm * km.transpose()) * sc;
          if (block_masked(causal, window, i0, n, j0, j1, T_, S)) apply_mask(s, causal, window, i0, j0, T_, S);
          for (int64_t r = 0; r < n; ++r) {  // P = exp(s - lse); masked and key-less rows -> 0
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
          dV.middleRows(j0, nb).noalias() += s.transpose() * gm;
          dp.noalias() = gm * vm.transpose();
          dp.array().colwise() -= di.array();
          s.array() *= dp.array();  // s now holds dS
          dqb.noalias() += (s * km) * sc;
          dK.middleRows(j0, nb).noalias() += (s.transpose() * qm) * sc;
        }
        MMap<T> dQ(pdq + ((b * Hq + h) * T_ + i0) * D, n, D, Eigen::OuterStride<>(D));
        dQ = dqb;
      }
    }
  }
}

/// inputs {g, q, k, v, out, lse}, attrs {is_causal, scale[, window]} -> {dq, dk, dv}.
std::vector<Tensor> k_sdpa_backward(const OpCall& c) {
  const DType dt = c.inputs[1].dtype();
  Tensor g = prepared(c.inputs[0], dt), q = prepared(c.inputs[1], dt), k = prepared(c.inputs[2], dt);
  Tensor v = prepared(c.inputs[3], dt), o = prepared(c.inputs[4], dt), lse = c.inputs[5].detach();
  if (lse.dtype() != dt) lse = to_dtype(lse, dt);
  DTR_CHECK(g.sizes() == o.sizes(), "sdpa_backward: gradient ", g.sizes(), " vs output ", o.sizes());
  Tensor dq = empty(q.sizes(), TensorOptions(dt)), dk = empty(k.sizes(), TensorOptions(dt));
  Tensor dv = empty(v.sizes(), TensorOptions(dt));
  cpu::dispatch_floating(dt, "sdpa_backward", [&](auto tag) {
    sdpa_backward<decltype(tag)>(g, q, k, v, o, lse, dq, dk, dv, c.b(0), c.f(1), sdpa_window(c));
  });
  return {dq, dk, dv};
}

DTR_REGISTER_KERNEL_EXACT("sdpa", DeviceType::CPU, k_sdpa);
DTR_REGISTER_KERNEL("sdpa_backward", DeviceType::CPU, k_sdpa_backward);

}  // namespace
}  // namespace dtr
