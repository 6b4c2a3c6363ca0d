// CPU kernels of softmax / log_softmax and their backward. The input is viewed as
// [outer, n, inner] (n = the softmax dim) over contiguous memory; every (outer, inner) line
// is processed by one thread in three passes (max, sum of exp, write). f32 lines with unit
// stride (softmax over the last dim) run vectorised through Eigen (cpu/vec.h); f64 and strided
// lines use the scalar loop with f64 sums.
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

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous(t.detach()); }

struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
};
Lines lines_of(const Shape& s, int64_t d) {
  Lines L;
  if (s.empty()) return L;  // 0-d: one line of one element
  for (int64_t i = 0; i < d; ++i) L.outer *= s[i];
  L.n = s[d];
  for (size_t i = d + 1; i < s.size(); ++i) L.inner *= s[i];
  return L;
}

template <bool kLog>
std::vector<Tensor> k_softmax(const OpCall& c) {
  const char* op = kLog ? "log_softmax" : "softmax";
  Tensor x = contig(c.inputs[0]);
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  const Lines L = lines_of(x.sizes(), c.i(0));
  cpu::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const int64_t nlines = L.outer * L.inner, n = L.n, inner = L.inner;
#pragma omp parallel for schedule(static) if (nlines * n >= cpu::kParallelGrain)
    for (int64_t line = 0; line < nlines; ++line) {
      const int64_t base = (line / inner) * n * inner + line % inner;
      const T* xi = px + base;
      T* oi = po + base;
      if constexpr (std::is_same_v<T, float>) {
        if (inner == 1) {
          float mv = cpu::vec::max(xi, n);
          if (mv == -std::numeric_limits<float>::infinity()) mv = 0;
          const double sv = cpu::vec::sum_exp(xi, n, mv);
          if constexpr (kLog) {
            const float lse = mv + static_cast<float>(std::log(sv));
            cpu::vec::MapF(oi, n) = cpu::vec::CMapF(xi, n) - lse;
          } else {
            const float inv = static_cast<float>(1.0 / sv);
            cpu::vec::exp_shift(xi, mv, inv, oi, n);
          }
          continue;
        }
      }
      T m = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < n; ++j) m = std::max(m, xi[j * inner]);
      if (m == -std::numeric_limits<T>::infinity()) m = 0;  // all -inf: keep exp(-inf - 0) = 0
      // Sum in double: long f32 rows (vocabularies) otherwise lose their many tiny terms.
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += static_cast<double>(std::exp(xi[j * inner] - m));
      if constexpr (kLog) {
        const T lse = m + static_cast<T>(std::log(s));
        for (int64_t j = 0; j < n; ++j) oi[j * inner] = xi[j * inner] - lse;
      } else {
        const T inv = static_cast<T>(1.0 / s);
        for (int64_t j = 0; j < n; ++j) oi[j * inner] = std::exp(xi[j * inner] - m) * inv;
      }
    }
  });
  return {out};
}

/// inputs {g, y}; softmax: y * (g - sum(g*y)); log_softmax: g - exp(y) * sum(g).
template <bool kLog>
std::vector<Tensor> k_softmax_backward(const OpCall& c) {
  const char* op = kLog ? "log_softmax_backward" : "softmax_backward";
  Tensor g = contig(c.inputs[0]), y = contig(c.inputs[1]);
  DTR_CHECK(g.sizes() == y.sizes() && g.dtype() == y.dtype(), op, ": gradient ", g.sizes(), " ", g.dtype(),
            " does not match output ", y.sizes(), " ", y.dtype());
  Tensor out = empty(y.sizes(), TensorOptions(y.dtype()));
  const Lines L = lines_of(y.sizes(), c.i(0));
  cpu::dispatch_floating(y.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* py = static_cast<const T*>(y.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const int64_t nlines = L.outer * L.inner, n = L.n, inner = L.inner;
#pragma omp parallel for schedule(static) if (nlines * n >= cpu::kParallelGrain)
    for (int64_t line = 0; line < nlines; ++line) {
      const int64_t base = (line / inner) * n * inner + line % inner;
      const T* gi = pg + base;
      const T* yi = py + base;
      T* oi = po + base;
      if constexpr (std::is_same_v<T, float>) {
        if (inner == 1) {
          const cpu::vec::CMapF gv(gi, n), yv(yi, n);
          if constexpr (kLog) {
            const float sv = static_cast<float>(cpu::vec::sum(gi, n));
            cpu::vec::exp_shift(yi, 0.0f, sv, oi, n);
            cpu::vec::MapF(oi, n) = gv - cpu::vec::MapF(oi, n);
          } else {
            const float sv = static_cast<float>(cpu::vec::dot(gi, yi, n));
            cpu::vec::MapF(oi, n) = yv * (gv - sv);
          }
          continue;
        }
      }
      double s = 0;  // double sum, as in the forward
      if constexpr (kLog) {
        for (int64_t j = 0; j < n; ++j) s += static_cast<double>(gi[j * inner]);
        for (int64_t j = 0; j < n; ++j) oi[j * inner] = gi[j * inner] - std::exp(yi[j * inner]) * s;
      } else {
        for (int64_t j = 0; j < n; ++j) s += static_cast<double>(gi[j * inner] * yi[j * inner]);
        for (int64_t j = 0; j < n; ++j) oi[j * inner] = yi[j * inner] * (gi[j * inner] - s);
      }
    }
  });
  return {out};
}

DTR_REGISTER_KERNEL("softmax", DeviceType::CPU, k_softmax<false>);
DTR_REGISTER_KERNEL("log_softmax", DeviceType::CPU, k_softmax<true>);
DTR_REGISTER_KERNEL("softmax_backward", DeviceType::CPU, k_softmax_backward<false>);
DTR_REGISTER_KERNEL("log_softmax_backward", DeviceType::CPU, k_softmax_backward<true>);

}  // namespace
}  // namespace dtr
