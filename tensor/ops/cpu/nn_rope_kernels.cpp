// CPU kernels of rotary_embedding (rotate-half layout) and its backward with respect to x.
// cos/sin broadcast to x (stride-0 dims); x and g are processed row by row (rows of D), read in
// place from strided views whose last dim has unit stride; the output keeps x's (g's) memory order
// (cpu/layout.h: q / k of the projections' [B, T, H, D] transposed to [B, H, T, D] come out in that
// layout, so the model's transpose back is a view), rows visited in its memory order. Row offsets
// advance by an odometer (no per-row division); unit-stride tables take a vectorised loop.
#include <algorithm>
#include <array>
#include <numeric>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/layout.h"
#include "tensor/ops/cpu/loops.h"

namespace dtr {
namespace {

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous(t.detach()); }

/// Element offsets of the rows (x viewed as [rows, D]) of N operands with (broadcast) strides
/// `st[k]` over x's shape: set to row r once (divisions), then advanced one row at a time by
/// an odometer over the outer dims (no division per row).
template <size_t N>
struct RowOffsets {
  const Shape& shape;
  std::array<const Shape*, N> st;
  std::vector<int64_t> idx;
  std::array<int64_t, N> off{};

  RowOffsets(const Shape& sh, std::array<const Shape*, N> strides, int64_t r) : shape(sh), st(strides) {
    const int64_t nd = static_cast<int64_t>(shape.size()) - 1;  // the outer dims
    idx.assign(static_cast<size_t>(std::max<int64_t>(nd, 0)), 0);
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = r % shape[d];
      r /= shape[d];
      for (size_t k = 0; k < N; ++k) off[k] += idx[d] * (*st[k])[d];
    }
  }
  void next() {
    for (int64_t d = static_cast<int64_t>(idx.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        for (size_t k = 0; k < N; ++k) off[k] += (*st[k])[d];
        return;
      }
      for (size_t k = 0; k < N; ++k) off[k] -= (shape[d] - 1) * (*st[k])[d];
      idx[d] = 0;
    }
  }
};

/// One row: kBackward: o = x*c + rotate_half^T(x*s); else o = x*c + rotate_half(x)*s.
/// Unit-stride tables (the rope_tables layout): one vectorisable loop.
template <bool kBackward, class T>
inline void rope_row(const T* __restrict xr, const T* __restrict cr, const T* __restrict sr, T* __restrict o,
                     int64_t h, int64_t cd, int64_t sd) {
  if (cd == 1 && sd == 1) {
    for (int64_t j = 0; j < h; ++j) {
      const T x1 = xr[j], x2 = xr[j + h];
      if constexpr (kBackward) {
        o[j] = x1 * cr[j] + x2 * sr[j + h];
        o[j + h] = x2 * cr[j + h] - x1 * sr[j];
      } else {
        o[j] = x1 * cr[j] - x2 * sr[j];
        o[j + h] = x2 * cr[j + h] + x1 * sr[j + h];
      }
    }
    return;
  }
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

/// Rows per parallel chunk (each chunk sets its offsets once).
constexpr int64_t kRowChunk = 256;

/// kBackward: out = g*cos + rotate_half^T(g*sin); else out = x*cos + rotate_half(x)*sin.
template <bool kBackward>
std::vector<Tensor> k_rope(const OpCall& c) {
  // x may be a strided view (q/k come as [B, T, H, D] transposed to [B, H, T, D]): rows are
  // read in place when D has unit stride and written in x's layout, so no copy is made.
  const Tensor& x0 = c.inputs[0];
  const Tensor x = (x0.dim() == 0 || x0.strides().back() == 1) ? x0 : contig(x0);
  const Shape& xst = x.strides();
  const Tensor& cs = c.inputs[1];
  const Tensor& sn = c.inputs[2];
  const Shape cst = cpu::broadcast_strides(cs, x.sizes()), sst = cpu::broadcast_strides(sn, x.sizes());
  const int64_t cd = cst.back(), sd = sst.back();
  Tensor out = cpu::empty_preserve_layout(x, x.dtype());
  // Rows are visited in the output's memory order (the outer dims sorted by its strides), so
  // [B, T, H, D] memory seen as [B, H, T, D] is read and written front to back, each table row
  // used for the H rows of its position in turn.
  const int64_t nd = x.dim();
  Shape order(static_cast<size_t>(std::max<int64_t>(nd - 1, 0)));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return out.stride(a) > out.stride(b); });
  auto permuted = [&](const Shape& v) {
    Shape p;
    for (int64_t d : order) p.push_back(v[d]);
    if (nd > 0) p.push_back(v.back());
    return p;
  };
  const Shape shape = permuted(x.sizes()), pxst = permuted(xst), pcst = permuted(cst), psst = permuted(sst),
              ost = permuted(out.strides());
  const int64_t D = x.sizes().back(), h = D / 2, rows = D == 0 ? 0 : x.numel() / D;
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  cpu::dispatch_floating(x.dtype(), "rotary_embedding", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pc = static_cast<const T*>(cs.data_ptr());
    const T* ps = static_cast<const T*>(sn.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (rows * D >= cpu::kParallelGrain)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t r0 = ch * kRowChunk, r1 = std::min(rows, r0 + kRowChunk);
      RowOffsets<4> at(shape, {&pxst, &pcst, &psst, &ost}, r0);
      for (int64_t r = r0; r < r1; ++r, at.next())
        rope_row<kBackward>(px + at.off[0], pc + at.off[1], ps + at.off[2], po + at.off[3], h, cd, sd);
    }
  });
  return {out};
}

DTR_REGISTER_KERNEL("rotary_embedding", DeviceType::CPU, k_rope<false>);
DTR_REGISTER_KERNEL("rotary_embedding_backward", DeviceType::CPU, k_rope<true>);

}  // namespace
}  // namespace dtr
