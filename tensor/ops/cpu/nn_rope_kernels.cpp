// CPU kernels of rotary_embedding (rotate-half layout) and its backward with respect to x.
// cos/sin broadcast to x (stride-0 dims); x and g are processed row by row (rows of D), read in
// place from strided views whose last dim has unit stride; the output is contiguous.
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"

namespace dtr {
namespace {

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous(t.detach()); }

/// Element offset of row r (x viewed as [rows, D]) in a tensor with broadcast strides `st`.
int64_t row_offset(int64_t r, const Shape& shape, const Shape& st) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    off += (r % shape[d]) * st[d];
    r /= shape[d];
  }
  return off;
}

/// kBackward: out = g*cos + rotate_half^T(g*sin); else out = x*cos + rotate_half(x)*sin.
template <bool kBackward>
std::vector<Tensor> k_rope(const OpCall& c) {
  // x may be a strided view (q/k come as [B, T, H, D] transposed to [B, H, T, D]): rows are
  // read in place when D has unit stride, so no contiguous copy is made.
  const Tensor& x0 = c.inputs[0];
  const Tensor x = (x0.dim() == 0 || x0.strides().back() == 1) ? x0 : contig(x0);
  const Shape& xst = x.strides();
  const bool x_contig = x.is_contiguous();
  const Tensor& cs = c.inputs[1];
  const Tensor& sn = c.inputs[2];
  const Shape cst = cpu::broadcast_strides(cs, x.sizes()), sst = cpu::broadcast_strides(sn, x.sizes());
  const int64_t cd = cst.back(), sd = sst.back();
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  const int64_t D = x.sizes().back(), h = D / 2, rows = D == 0 ? 0 : x.numel() / D;
  cpu::dispatch_floating(x.dtype(), "rotary_embedding", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pc = static_cast<const T*>(cs.data_ptr());
    const T* ps = static_cast<const T*>(sn.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (rows * D >= cpu::kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = px + (x_contig ? r * D : row_offset(r, x.sizes(), xst));
      const T* cr = pc + row_offset(r, x.sizes(), cst);
      const T* sr = ps + row_offset(r, x.sizes(), sst);
      T* o = po + r * D;
      for (int64_t j = 0; j < h; ++j) {
        const T x1 = xr[j], x2 = xr[j + h];
        const T c1 = cr[j * cd], c2 = cr[(j + h) * cd], s1 = sr[j * sd], s2 = sr[(j + h) * sd];
        if constexpr (kBackward) {
          o[j] = x1 * c1 + x2 * s2;
          o[j + h] = x2 * c2 - x1 * s1;
        } else {
          o[j] = x1 * c1 - x2 * s1;
          o[j + h] = x2 * c2 + x1 * s2;
        }
      }
    }
  });
  return {out};
}

DTR_REGISTER_KERNEL("rotary_embedding", DeviceType::CPU, k_rope<false>);
DTR_REGISTER_KERNEL("rotary_embedding_backward", DeviceType::CPU, k_rope<true>);

}  // namespace
}  // namespace dtr
