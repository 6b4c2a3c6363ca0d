// CUDA kernels of softmax / log_softmax over one dim and their backward ops, same formulas as
// ops/cpu/softmax_kernels.cpp (max-subtracted exponentials; a line of all -inf gives 0 /
// -inf like the CPU):
//   softmax_backward(g, y):     y * (g - sum(g * y))
//   log_softmax_backward(g, y): g - exp(y) * sum(g)
// The input is viewed as [outer, n, inner] over contiguous memory. inner == 1 (the last dim):
// one block per row, block reductions in f32 (f64 for f64). inner > 1: one thread per
// (outer, inner) line, reading with stride inner (coalesced across neighbouring threads).
// The CPU sums in f64; sums here are f32 tree sums, well within the f32 test tolerance.
#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
};
Lines lines_of(const Shape& s, int64_t d) {
  Lines L;
  if (s.empty()) return L;
  for (int64_t i = 0; i < d; ++i) L.outer *= s[i];
  L.n = s[d];
  for (size_t i = d + 1; i < s.size(); ++i) L.inner *= s[i];
  return L;
}

template <class T, bool kLog>
__global__ void softmax_rows_kernel(const T* x, T* out, int64_t n) {
  using A = acc_t<T>;
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  T* o = out + static_cast<int64_t>(blockIdx.x) * n;
  A m = lowest_of<A>();
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = max_of(m, load(xr[j]));
  m = block_max(m);
  if (m == lowest_of<A>()) m = A(0);  // all -inf: exp(-inf - 0) = 0
  A s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += exp(load(xr[j]) - m);
  s = block_sum(s);
  if constexpr (kLog) {
    const A lse = m + log(s);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] = store<T>(load(xr[j]) - lse);
  } else {
    const A inv = A(1) / s;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] = store<T>(exp(load(xr[j]) - m) * inv);
  }
}

template <class T, bool kLog>
__global__ void softmax_lines_kernel(const T* x, T* out, int64_t outer, int64_t n, int64_t inner) {
  using A = acc_t<T>;
  DTR_GRID_STRIDE_LOOP(line, outer * inner) {
    const int64_t base = (line / inner) * n * inner + line % inner;
    const T* xi = x + base;
    T* oi = out + base;
    A m = lowest_of<A>();
    for (int64_t j = 0; j < n; ++j) m = max_of(m, load(xi[j * inner]));
    if (m == lowest_of<A>()) m = A(0);
    A s = 0;
    for (int64_t j = 0; j < n; ++j) s += exp(load(xi[j * inner]) - m);
    if constexpr (kLog) {
      const A lse = m + log(s);
      for (int64_t j = 0; j < n; ++j) oi[j * inner] = store<T>(load(xi[j * inner]) - lse);
    } else {
      const A inv = A(1) / s;
      for (int64_t j = 0; j < n; ++j) oi[j * inner] = store<T>(exp(load(xi[j * inner]) - m) * inv);
    }
  }
}

template <class T, bool kLog>
__global__ void softmax_bwd_rows_kernel(const T* g, const T* y, T* out, int64_t n) {
  using A = acc_t<T>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  A s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    s += kLog ? load(g[base + j]) : load(g[base + j]) * load(y[base + j]);
  s = block_sum(s);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const A gj = load(g[base + j]), yj = load(y[base + j]);
    out[base + j] = store<T>(kLog ? gj - exp(yj) * s : yj * (gj - s));
  }
}

template <class T, bool kLog>
__global__ void softmax_bwd_lines_kernel(const T* g, const T* y, T* out, int64_t outer, int64_t n, int64_t inner) {
  using A = acc_t<T>;
  DTR_GRID_STRIDE_LOOP(line, outer * inner) {
    const int64_t base = (line / inner) * n * inner + line % inner;
    A s = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k = base + j * inner;
      s += kLog ? load(g[k]) : load(g[k]) * load(y[k]);
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k = base + j * inner;
      const A gj = load(g[k]), yj = load(y[k]);
      out[k] = store<T>(kLog ? gj - exp(yj) * s : yj * (gj - s));
    }
  }
}

template <bool kLog>
std::vector<Tensor> k_softmax(const OpCall& c) {
  const char* op = kLog ? "log_softmax" : "softmax";
  Tensor out = cuda_empty(c.inputs[0].sizes(), c.inputs[0].dtype(), c.inputs[0]);
  if (out.numel() == 0) return {out};
  DeviceGuard guard(out.device());
  const Tensor x = cuda_contiguous(c.inputs[0]);
  const Lines L = lines_of(x.sizes(), c.i(0));
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (L.inner == 1)
      softmax_rows_kernel<T, kLog><<<static_cast<unsigned>(L.outer), threads_for_row(L.n), 0, s>>>(px, po, L.n);
    else
      softmax_lines_kernel<T, kLog><<<blocks_for(L.outer * L.inner), kThreads, 0, s>>>(px, po, L.outer, L.n, L.inner);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

template <bool kLog>
std::vector<Tensor> k_softmax_backward(const OpCall& c) {
  const char* op = kLog ? "log_softmax_backward" : "softmax_backward";
  DTR_CHECK(c.inputs[0].sizes() == c.inputs[1].sizes() && c.inputs[0].dtype() == c.inputs[1].dtype(), op,
            ": gradient ", c.inputs[0].sizes(), " ", c.inputs[0].dtype(), " does not match output ",
            c.inputs[1].sizes(), " ", c.inputs[1].dtype());
  Tensor out = cuda_empty(c.inputs[1].sizes(), c.inputs[1].dtype(), c.inputs[1]);
  if (out.numel() == 0) return {out};
  DeviceGuard guard(out.device());
  const Tensor g = cuda_contiguous(c.inputs[0]), y = cuda_contiguous(c.inputs[1]);
  const Lines L = lines_of(y.sizes(), c.i(0));
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(y.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* py = static_cast<const T*>(y.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (L.inner == 1)
      softmax_bwd_rows_kernel<T, kLog><<<static_cast<unsigned>(L.outer), threads_for_row(L.n), 0, s>>>(pg, py, po, L.n);
    else
      softmax_bwd_lines_kernel<T, kLog>
          <<<blocks_for(L.outer * L.inner), kThreads, 0, s>>>(pg, py, po, L.outer, L.n, L.inner);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

DTR_REGISTER_KERNEL("softmax", DeviceType::CUDA, k_softmax<false>);
DTR_REGISTER_KERNEL("log_softmax", DeviceType::CUDA, k_softmax<true>);
DTR_REGISTER_KERNEL("softmax_backward", DeviceType::CUDA, k_softmax_backward<false>);
DTR_REGISTER_KERNEL("log_softmax_backward", DeviceType::CUDA, k_softmax_backward<true>);

}  // namespace
}  // namespace dtr::cuda_ops
