// CPU kernels of rms_norm and rms_norm_backward: one pass per row (rows in parallel).
// Backward per row with r = rsqrt(mean(x^2) + eps), u = g * w:
//   dx = r * u - r^3 / D * x * sum(u * x),   dweight = sum over rows of g * x * r
// dweight is summed into per-thread buffers (f64) and reduced at the end.
// f32 rows run vectorised (cpu/vec.h: f32 block sums added in f64); f64 rows keep the scalar
// f64 loops.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/vec.h"

namespace dtr {
namespace {

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous(t.detach()); }

template <class T>
T row_rstd(const T* x, int64_t D, double eps) {
  double ss = 0;
  for (int64_t j = 0; j < D; ++j) ss += static_cast<double>(x[j]) * x[j];
  return static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
}

template <>
float row_rstd<float>(const float* x, int64_t D, double eps) {
  return static_cast<float>(1.0 / std::sqrt(cpu::vec::dot(x, x, D) / static_cast<double>(D) + eps));
}

std::vector<Tensor> k_rms_norm(const OpCall& c) {
  Tensor x = contig(c.inputs[0]), w = contig(c.inputs[1]);
  const double eps = c.f(0);
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  const int64_t D = x.sizes().back(), rows = D == 0 ? 0 : x.numel() / D;
  cpu::dispatch_floating(x.dtype(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pw = static_cast<const T*>(w.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (rows * D >= cpu::kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = px + r * D;
      T* o = po + r * D;
      const T rs = row_rstd(xr, D, eps);
      if constexpr (std::is_same_v<T, float>) {
        cpu::vec::MapF(o, D) = cpu::vec::CMapF(xr, D) * rs * cpu::vec::CMapF(pw, D);
      } else {
        for (int64_t j = 0; j < D; ++j) o[j] = xr[j] * rs * pw[j];
      }
    }
  });
  return {out};
}

/// inputs {g, x, w}, attrs {eps} -> {dx, dw}.
std::vector<Tensor> k_rms_norm_backward(const OpCall& c) {
  Tensor g = contig(c.inputs[0]), x = contig(c.inputs[1]), w = contig(c.inputs[2]);
  const double eps = c.f(0);
  DTR_CHECK(g.sizes() == x.sizes(), "rms_norm_backward: gradient ", g.sizes(), " vs x ", x.sizes());
  Tensor dx = empty(x.sizes(), TensorOptions(x.dtype()));
  const int64_t D = x.sizes().back(), rows = D == 0 ? 0 : x.numel() / D;
  Tensor dw = empty({D}, TensorOptions(w.dtype()));
  cpu::dispatch_floating(x.dtype(), "rms_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pw = static_cast<const T*>(w.data_ptr());
    T* pdx = static_cast<T*>(dx.data_ptr());
    const bool par = rows * D >= cpu::kParallelGrain;
    const int nt = par ? omp_get_max_threads() : 1;
    std::vector<double> part(static_cast<size_t>(nt) * D, 0.0);
#pragma omp parallel num_threads(nt) if (par)
    {
      double* acc = part.data() + static_cast<size_t>(omp_get_thread_num()) * D;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = px + r * D;
        const T* gr = pg + r * D;
        T* o = pdx + r * D;
        if constexpr (std::is_same_v<T, float>) {
          using cpu::vec::CMapF;
          const float rsf = row_rstd(xr, D, eps);
          const CMapF xv(xr, D), gv(gr, D), wv(pw, D);
          const double rsd = rsf;
          double dot = 0;
          for (int64_t b = 0; b < D; b += cpu::vec::kSumBlock) {
            const int64_t len = std::min(cpu::vec::kSumBlock, D - b);
            dot += static_cast<double>((gv.segment(b, len) * wv.segment(b, len) * xv.segment(b, len)).sum());
          }
          const float k = static_cast<float>(rsd * rsd * rsd * dot / static_cast<double>(D));
          cpu::vec::MapF(o, D) = rsf * gv * wv - k * xv;
          for (int64_t j = 0; j < D; ++j) acc[j] += static_cast<double>(gr[j] * xr[j] * rsf);
          continue;
        }
        const double rs = row_rstd(xr, D, eps);
        double dot = 0;
        for (int64_t j = 0; j < D; ++j) dot += static_cast<double>(gr[j]) * pw[j] * xr[j];
        const double k = rs * rs * rs * dot / static_cast<double>(D);
        for (int64_t j = 0; j < D; ++j) {
          o[j] = static_cast<T>(rs * gr[j] * pw[j] - k * xr[j]);
          acc[j] += static_cast<double>(gr[j]) * xr[j] * rs;
        }
      }
    }
    T* pdw = static_cast<T*>(dw.data_ptr());
    for (int64_t j = 0; j < D; ++j) {
      double s = 0;
      for (int t = 0; t < nt; ++t) s += part[static_cast<size_t>(t) * D + j];
      pdw[j] = static_cast<T>(s);
    }
  });
  return {dx, dw};
}

DTR_REGISTER_KERNEL("rms_norm", DeviceType::CPU, k_rms_norm);
DTR_REGISTER_KERNEL("rms_norm_backward", DeviceType::CPU, k_rms_norm_backward);

}  // namespace
}  // namespace dtr
