// CUDA kernels of rms_norm and rms_norm_backward (fused), same formulas as
// ops/cpu/nn_norm_kernels.cpp. Per row of D with r = rsqrt(mean(x^2) + eps), u = g * w:
//   y  = x * r * w
//   dx = r * u - r^3 / D * x * sum(u * x)
//   dw = sum over rows of g * x * r
// Forward and dx: one block per row, block reductions in f32 (f64 for f64). dw: a
// deterministic two-pass column reduction (32 x 8 thread tiles over row chunks write f32
// partials [splits, D]; one thread per column sums its partials in order). No atomics.
#include <algorithm>

#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

template <class T>
__global__ void rms_norm_kernel(const T* x, const T* w, T* out, int64_t D, double eps) {
  using A = acc_t<T>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * D;
  A ss = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const A v = load(x[base + j]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const A rs = A(1) / sqrt(ss / static_cast<A>(D) + static_cast<A>(eps));
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) out[base + j] = store<T>(load(x[base + j]) * rs * load(w[j]));
}

/// dx for one row per block; also writes r of each row to rstd (for dw).
template <class T>
__global__ void rms_norm_dx_kernel(const T* g, const T* x, const T* w, T* dx, acc_t<T>* rstd, int64_t D, double eps) {
  using A = acc_t<T>;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * D;
  A ss = 0, dot = 0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const A xv = load(x[base + j]);
    ss += xv * xv;
    dot += load(g[base + j]) * load(w[j]) * xv;
  }
  ss = block_sum(ss);
  dot = block_sum(dot);
  const A rs = A(1) / sqrt(ss / static_cast<A>(D) + static_cast<A>(eps));
  const A k = rs * rs * rs * dot / static_cast<A>(D);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    dx[base + j] = store<T>(rs * load(g[base + j]) * load(w[j]) - k * load(x[base + j]));
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
}

/// partial[s, j] = sum over rows r in chunk s of g[r, j] * x[r, j] * rstd[r]; block (32, 8).
template <class T>
__global__ void rms_norm_dw_partial_kernel(const T* g, const T* x, const acc_t<T>* rstd, acc_t<T>* partial,
                                           int64_t rows, int64_t D, int64_t chunk) {
  using A = acc_t<T>;
  __shared__ A sh[8][33];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk, end = min(rows, begin + chunk);
  A acc = 0;
  if (j < D)
    for (int64_t r = begin + threadIdx.y; r < end; r += 8) acc += load(g[r * D + j]) * load(x[r * D + j]) * rstd[r];
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < D) {
    A v = 0;
    for (int k = 0; k < 8; ++k) v += sh[k][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * D + j] = v;
  }
}

template <class T>
__global__ void sum_partials_kernel(const acc_t<T>* partial, T* out, int64_t splits, int64_t D) {
  DTR_GRID_STRIDE_LOOP(j, D) {
    acc_t<T> v = 0;
    for (int64_t s = 0; s < splits; ++s) v += partial[s * D + j];
    out[j] = store<T>(v);
  }
}

std::vector<Tensor> k_rms_norm(const OpCall& c) {
  const Tensor& x0 = c.inputs[0];
  Tensor out = cuda_empty(x0.sizes(), x0.dtype(), x0);
  const int64_t D = x0.sizes().back(), rows = D == 0 ? 0 : x0.numel() / D;
  if (rows == 0) return {out};
  DeviceGuard guard(x0.device());
  const Tensor x = cuda_contiguous(x0), w = cuda_contiguous(c.inputs[1]);
  const double eps = c.f(0);
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(x.dtype(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    rms_norm_kernel<T><<<static_cast<unsigned>(rows), threads_for_row(D), 0, s>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()), static_cast<T*>(out.data_ptr()), D,
        eps);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

/// inputs {g, x, w}, attrs {eps} -> {dx, dw}.
std::vector<Tensor> k_rms_norm_backward(const OpCall& c) {
  const Tensor& x0 = c.inputs[1];
  DTR_CHECK(c.inputs[0].sizes() == x0.sizes(), "rms_norm_backward: gradient ", c.inputs[0].sizes(), " vs x ",
            x0.sizes());
  DTR_CHECK(c.inputs[0].dtype() == x0.dtype() && c.inputs[2].dtype() == x0.dtype(),
            "rms_norm_backward: dtypes differ: g ", c.inputs[0].dtype(), ", x ", x0.dtype(), ", w ",
            c.inputs[2].dtype());
  const int64_t D = x0.sizes().back(), rows = D == 0 ? 0 : x0.numel() / D;
  Tensor dx = cuda_empty(x0.sizes(), x0.dtype(), x0);
  Tensor dw = cuda_empty({D}, c.inputs[2].dtype(), x0);
  if (D == 0) return {dx, dw};
  DeviceGuard guard(x0.device());
  if (rows == 0) {
    cuda_zero(dw);
    return {dx, dw};
  }
  const Tensor g = cuda_contiguous(c.inputs[0]), x = cuda_contiguous(x0), w = cuda_contiguous(c.inputs[2]);
  const double eps = c.f(0);
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(x.dtype(), "rms_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* px = static_cast<const T*>(x.data_ptr());
    Tensor rstd = cuda_empty({rows}, dtype_of_acc<A>(), x);
    rms_norm_dx_kernel<T><<<static_cast<unsigned>(rows), threads_for_row(D), 0, s>>>(
        pg, px, static_cast<const T*>(w.data_ptr()), static_cast<T*>(dx.data_ptr()), static_cast<A*>(rstd.data_ptr()),
        D, eps);
    DTR_CUDA_CHECK_LAUNCH();
    // Row chunks of at least 64 rows; about 512 blocks in all.
    const int64_t tiles = (D + 31) / 32;
    int64_t splits = std::clamp<int64_t>(512 / tiles, 1, std::max<int64_t>(1, rows / 64));
    splits = std::min<int64_t>(splits, 1024);
    const int64_t chunk = (rows + splits - 1) / splits;
    splits = (rows + chunk - 1) / chunk;
    Tensor partial = cuda_empty({splits, D}, dtype_of_acc<A>(), x);
    rms_norm_dw_partial_kernel<T><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), dim3(32, 8), 0, s>>>(
        pg, px, static_cast<const A*>(rstd.data_ptr()), static_cast<A*>(partial.data_ptr()), rows, D, chunk);
    DTR_CUDA_CHECK_LAUNCH();
    sum_partials_kernel<T><<<blocks_for(D), kThreads, 0, s>>>(static_cast<const A*>(partial.data_ptr()),
                                                              static_cast<T*>(dw.data_ptr()), splits, D);
    DTR_CUDA_CHECK_LAUNCH();
  });
  return {dx, dw};
}

DTR_REGISTER_KERNEL("rms_norm", DeviceType::CUDA, k_rms_norm);
DTR_REGISTER_KERNEL("rms_norm_backward", DeviceType::CUDA, k_rms_norm_backward);

}  // namespace
}  // namespace dtr::cuda_ops
