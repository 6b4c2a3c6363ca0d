#pragma once
// Strided loops for CPU kernels: N operands with arbitrary (broadcast, zero) strides are
// coalesced into the fewest dims, then iterated row by row (innermost dim as a strided run),
// parallelised with OpenMP over rows when the work is large enough.
#include <array>
#include <cstdint>

#include "tensor/tensor.h"

namespace dtr::cpu {

/// Elements per OpenMP task below which loops stay serial (thread start costs ~1-5 us).
constexpr int64_t kParallelGrain = 32768;

template <size_t N>
struct Layout {
  Shape shape;
  std::array<Shape, N> strides;  // element strides per operand
};

/// Merges adjacent dims that are contiguous with each other for every operand and drops
/// size-1 dims. The innermost dim stays last.
template <size_t N>
Layout<N> coalesce(const Shape& shape, const std::array<Shape, N>& strides) {
  Layout<N> out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!out.shape.empty()) {
      bool merge = true;
      for (size_t k = 0; k < N; ++k)
        if (out.strides[k].back() != strides[k][d] * shape[d]) merge = false;
      if (merge) {
        out.shape.back() *= shape[d];
        for (size_t k = 0; k < N; ++k) out.strides[k].back() = strides[k][d];
        continue;
      }
    }
    out.shape.push_back(shape[d]);
    for (size_t k = 0; k < N; ++k) out.strides[k].push_back(strides[k][d]);
  }
  if (out.shape.empty()) {
    out.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) out.strides[k].push_back(0);
  }
  return out;
}

/// Calls f(offsets, inner_size, inner_strides) for every innermost row, with element offsets
/// of each operand. Rows run in parallel when the total work is large.
template <size_t N, class F>
void for_each_row(const Layout<N>& L, F&& f) {
  const int64_t nd = static_cast<int64_t>(L.shape.size());
  const int64_t inner = L.shape.back();
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < nd; ++d) rows *= L.shape[d];
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = L.strides[k].back();
  auto run = [&](int64_t r) {
    std::array<int64_t, N> off{};
    int64_t rem = r;
    for (int64_t d = nd - 2; d >= 0; --d) {
      const int64_t i = rem % L.shape[d];
      rem /= L.shape[d];
      for (size_t k = 0; k < N; ++k) off[k] += i * L.strides[k][d];
    }
    f(off, inner, inner_strides);
  };
  if (rows * inner >= kParallelGrain && rows > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) run(r);
  } else {
    for (int64_t r = 0; r < rows; ++r) run(r);
  }
}

/// Strides of `t` viewed with shape `shape` (t broadcast to it: stretched dims get stride 0).
Shape broadcast_strides(const Tensor& t, const Shape& shape);

/// Calls f(T{}) with T the C++ type of floating dtype `dt` (f32/f64; bf16/f16 are upcast by
/// the dispatcher before CPU kernels run). Errors name `op`.
template <class F>
void dispatch_floating(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    default: DTR_ERROR(op, ": unsupported dtype ", dt, " (expected a floating dtype)");
  }
}

/// Like dispatch_floating, also for i64 / i32.
template <class F>
void dispatch_numeric(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    case DType::i64: f(int64_t{}); break;
    case DType::i32: f(int32_t{}); break;
    default: DTR_ERROR(op, ": unsupported dtype ", dt);
  }
}

/// out = f(a) elementwise; out is a new contiguous tensor of a's shape and dtype `out_dt`.
template <class Tin, class Tout, class F>
void unary_loop(const Tensor& a, Tensor& out, F&& f) {
  const Tin* pa = static_cast<const Tin*>(a.data_ptr());
  Tout* po = static_cast<Tout*>(out.data_ptr());
  if (a.is_contiguous()) {
    const int64_t n = a.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i]);
    return;
  }
  auto L = coalesce<2>(a.sizes(), {out.strides(), a.strides()});
  for_each_row(L, [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
    for (int64_t j = 0; j < n; ++j) po[off[0] + j * st[0]] = f(pa[off[1] + j * st[1]]);
  });
}

/// out = f(a, b) elementwise with broadcasting; out is contiguous with the broadcast shape.
template <class T, class Tout, class F>
void binary_loop(const Tensor& a, const Tensor& b, Tensor& out, F&& f) {
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  Tout* po = static_cast<Tout*>(out.data_ptr());
  if (a.sizes() == out.sizes() && b.sizes() == out.sizes() && a.is_contiguous() && b.is_contiguous()) {
    const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
    return;
  }
  auto L = coalesce<3>(out.sizes(), {out.strides(), broadcast_strides(a, out.sizes()), broadcast_strides(b, out.sizes())});
  for_each_row(L, [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
    Tout* o = po + off[0];
    const T* x = pa + off[1];
    const T* y = pb + off[2];
    if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
      for (int64_t j = 0; j < n; ++j) o[j] = f(x[j], y[j]);
    } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
      const T yv = *y;
      for (int64_t j = 0; j < n; ++j) o[j] = f(x[j], yv);
    } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
      const T xv = *x;
      for (int64_t j = 0; j < n; ++j) o[j] = f(xv, y[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) o[j * st[0]] = f(x[j * st[1]], y[j * st[2]]);
    }
  });
}

}  // namespace dtr::cpu
