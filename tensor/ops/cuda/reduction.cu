// CUDA kernels of reductions: sum and amax over any dims (keepdim), all / any (logical and / or
// into bool), max_dim (values + first index of the maximum along one dim) and max_dim_backward. Same semantics as
// ops/cpu/reduction_kernels.cpp. Accumulation: f32 for f32/bf16/f16, f64 for f64, i64 for
// integers. Deterministic: fixed tree order, no atomics.
// Layouts:
//   - contiguous input reduced over a leading block of dims (bias gradients, sum_to): columns
//     of a [R, cols] matrix, reduced by 32 x 8 thread tiles;
//   - otherwise the reduced dims are moved last (a permuted view, copied when not contiguous)
//     and rows of length R are reduced, one block per row.
// When there are few outputs and long reductions, the work is split over more blocks that
// write f32 / f64 partials, and a second pass reduces the partials (still deterministic).
#include <algorithm>

#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"
#include "tensor/ops/shape.h"

namespace dtr::cuda_ops {
namespace {

/// Accumulation type of sum: i64 for integers, acc_t otherwise.
template <class T> using sum_acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, acc_t<T>>;

/// Blocks wanted in flight to fill the GPU (H200: 132 SMs, a few blocks each).
constexpr int64_t kTargetBlocks = 512;

template <class A, bool kMax>
__device__ __forceinline__ A combine(A a, A b) {
  if constexpr (kMax) return max_of(a, b);
  else return a + b;
}
template <class A, bool kMax>
__device__ __forceinline__ A identity() {
  if constexpr (kMax) return lowest_of<A>();
  else return A(0);
}

/// grid (rows, splits): block (row, s) reduces x[row, s*chunk : min(R, (s+1)*chunk)] into
/// out[row * splits + s].
template <class Tin, class A, class Tout, bool kMax>
__global__ void row_reduce_kernel(const Tin* x, Tout* out, int64_t R, int64_t chunk) {
  const int64_t row = blockIdx.x, split = blockIdx.y;
  const int64_t begin = split * chunk, end = min(R, begin + chunk);
  const Tin* xr = x + row * R;
  A acc = identity<A, kMax>();
  for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x) acc = combine<A, kMax>(acc, static_cast<A>(load(xr[r])));
  acc = kMax ? block_max(acc) : block_sum(acc);
  if (threadIdx.x == 0) out[row * gridDim.y + split] = store<Tout>(acc);
}

/// x as [R, cols]; block (32, 8) handles 32 columns; grid (col tiles, splits): block (c, s)
/// reduces rows [s*chunk, min(R, (s+1)*chunk)) into out[s * cols + col].
template <class Tin, class A, class Tout, bool kMax>
__global__ void col_reduce_kernel(const Tin* x, Tout* out, int64_t R, int64_t cols, int64_t chunk) {
  __shared__ A sh[8][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk, end = min(R, begin + chunk);
  A acc = identity<A, kMax>();
  if (col < cols)
    for (int64_t r = begin + threadIdx.y; r < end; r += 8) acc = combine<A, kMax>(acc, static_cast<A>(load(x[r * cols + col])));
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    A v = sh[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) v = combine<A, kMax>(v, sh[k][threadIdx.x]);
    out[static_cast<int64_t>(blockIdx.y) * cols + col] = store<Tout>(v);
  }
}

/// Splits of a reduction of length R when `outputs` blocks exist otherwise (>= 1).
int64_t splits_for(int64_t outputs_blocks, int64_t R, int64_t min_chunk) {
  if (outputs_blocks >= kTargetBlocks || R <= 2 * min_chunk) return 1;
  const int64_t want = std::max<int64_t>(1, kTargetBlocks / std::max<int64_t>(outputs_blocks, 1));
  return std::min<int64_t>({want, (R + min_chunk - 1) / min_chunk, 1024});
}

/// Reduces contiguous x viewed as [rows, R] into contiguous out [rows].
template <class T, class A, bool kMax>
void reduce_rows(const Tensor& x, const Tensor& out, int64_t rows, int64_t R) {
  cudaStream_t s = cuda::current_stream();
  const T* px = static_cast<const T*>(x.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  int64_t splits = splits_for(rows, R, 2048);
  int64_t chunk = (R + splits - 1) / splits;
  splits = (R + chunk - 1) / chunk;
  if (splits == 1) {
    row_reduce_kernel<T, A, T, kMax><<<dim3(static_cast<unsigned>(rows), 1), threads_for_row(R), 0, s>>>(px, po, R, R);
    DTR_CUDA_CHECK_LAUNCH();
    return;
  }
  Tensor part = cuda_empty({rows, splits}, dtype_of_acc<A>(), x);
  A* pp = static_cast<A*>(part.data_ptr());
  row_reduce_kernel<T, A, A, kMax>
      <<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(splits)), kThreads, 0, s>>>(px, pp, R, chunk);
  DTR_CUDA_CHECK_LAUNCH();
  row_reduce_kernel<A, A, T, kMax><<<dim3(static_cast<unsigned>(rows), 1), threads_for_row(splits), 0, s>>>(
      pp, po, splits, splits);
  DTR_CUDA_CHECK_LAUNCH();
}

/// Reduces contiguous x viewed as [R, cols] over R into contiguous out [cols].
template <class T, class A, bool kMax>
void reduce_cols(const Tensor& x, const Tensor& out, int64_t R, int64_t cols) {
  cudaStream_t s = cuda::current_stream();
  const T* px = static_cast<const T*>(x.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  const int64_t tiles = (cols + 31) / 32;
  int64_t splits = splits_for(tiles, R, 256);
  int64_t chunk = (R + splits - 1) / splits;
  splits = (R + chunk - 1) / chunk;
  const dim3 block(32, 8);
  if (splits == 1) {
    col_reduce_kernel<T, A, T, kMax><<<dim3(static_cast<unsigned>(tiles), 1), block, 0, s>>>(px, po, R, cols, R);
    DTR_CUDA_CHECK_LAUNCH();
    return;
  }
  Tensor part = cuda_empty({splits, cols}, dtype_of_acc<A>(), x);
  A* pp = static_cast<A*>(part.data_ptr());
  col_reduce_kernel<T, A, A, kMax>
      <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), block, 0, s>>>(px, pp, R, cols, chunk);
  DTR_CUDA_CHECK_LAUNCH();
  col_reduce_kernel<A, A, T, kMax><<<dim3(static_cast<unsigned>(tiles), 1), block, 0, s>>>(pp, po, splits, cols, splits);
  DTR_CUDA_CHECK_LAUNCH();
}

/// x permuted so that kept dims come first and `dims` last, contiguous; rows / R set.
Tensor reduced_last(const Tensor& x, const Shape& dims, int64_t& rows, int64_t& R) {
  return cuda_contiguous(reduced_last_view(x, dims, rows, R));
}

/// sum / amax of x over `dims` into out (contiguous, reduced shape).
template <bool kMax>
void reduce(const Tensor& x, const Shape& dims, const Tensor& out, const char* op) {
  if (out.numel() == 0) return;
  DeviceGuard guard(x.device());
  if (x.numel() == 0) {  // sum over an empty dim (amax refused it before)
    cuda_zero(out);
    return;
  }
  bool prefix = x.is_contiguous() && !dims.empty() && static_cast<int64_t>(dims.size()) < x.dim();
  for (size_t i = 0; i < dims.size() && prefix; ++i) prefix = dims[i] == static_cast<int64_t>(i);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    using A = std::conditional_t<kMax, acc_t<T>, sum_acc_t<T>>;
    if (prefix) {
      const int64_t cols = out.numel();
      reduce_cols<T, A, kMax>(x, out, x.numel() / cols, cols);
      return;
    }
    int64_t rows, R;
    Tensor p = reduced_last(x, dims, rows, R);
    reduce_rows<T, A, kMax>(p, out, rows, R);
  };
  dispatch_numeric(x.dtype(), op, run);
}

std::vector<Tensor> k_sum(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Shape dims = reduction_dims(c.shape(0), x.dim(), "sum");
  Tensor out = cuda_empty(reduced_shape(x.sizes(), dims, c.b(1)), x.dtype(), x);
  reduce<false>(x, dims, out, "sum");
  return {out};
}

std::vector<Tensor> k_amax(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Shape dims = reduction_dims(c.shape(0), x.dim(), "amax");
  for (int64_t d : dims) DTR_CHECK(x.sizes()[d] > 0, "amax: reducing dim ", d, " of size 0 in ", x.sizes());
  Tensor out = cuda_empty(reduced_shape(x.sizes(), dims, c.b(1)), x.dtype(), x);
  reduce<true>(x, dims, out, "amax");
  return {out};
}

/// One block per row of [rows, R]: out[row] = any (kAny) / all of x != 0 over the row. Empty
/// rows give false / true (the identities).
template <class T, bool kAny>
__global__ void logical_rows_kernel(const T* x, bool* out, int64_t R) {
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * R;
  int hit = 0;  // any: a nonzero seen; all: a zero seen
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x)
    if ((load(xr[r]) != acc_t<T>(0)) == kAny) hit = 1;
  hit = block_max(hit);
  if (threadIdx.x == 0) out[blockIdx.x] = kAny ? hit != 0 : hit == 0;
}

/// all / any over `dims` of any dtype (nonzero = true) into a bool tensor, as on the CPU.
template <bool kAny>
std::vector<Tensor> logical_reduce(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Shape dims = reduction_dims(c.shape(0), x.dim(), c.name());
  Tensor out = cuda_empty(reduced_shape(x.sizes(), dims, c.b(1)), DType::bool_, x);
  if (out.numel() == 0) return {out};
  DeviceGuard guard(x.device());
  int64_t rows, R;
  Tensor p = reduced_last(x, dims, rows, R);
  cudaStream_t s = cuda::current_stream();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    logical_rows_kernel<T, kAny><<<static_cast<unsigned>(rows), threads_for_row(R), 0, s>>>(
        static_cast<const T*>(p.data_ptr()), static_cast<bool*>(out.data_ptr()), R);
  };
  if (x.dtype() == DType::u8 || x.dtype() == DType::bool_) run(uint8_t{});
  else dispatch_numeric(x.dtype(), c.name(), run);
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

/// One block per row of [rows, R]: the value and the first index of the row's maximum.
template <class T>
__global__ void argmax_rows_kernel(const T* x, T* vals, int64_t* idx, int64_t R) {
  using A = acc_t<T>;
  __shared__ A sv[kThreads];
  __shared__ int64_t si[kThreads];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * R;
  A best = lowest_of<A>();
  int64_t bi = R;  // R = "no element seen"
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    const A v = load(xr[r]);
    if (bi == R || v > best) {  // strided scan visits r in increasing order: strict > keeps the first
      best = v;
      bi = r;
    }
  }
  sv[threadIdx.x] = best;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      const A ov = sv[threadIdx.x + w];
      const int64_t oi = si[threadIdx.x + w];
      const int64_t mi = si[threadIdx.x];
      const bool take = oi != R && (mi == R || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < mi));
      if (take) {
        sv[threadIdx.x] = ov;
        si[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int64_t b = si[0] == R ? 0 : si[0];
    vals[blockIdx.x] = xr[b];
    idx[blockIdx.x] = b;
  }
}

std::vector<Tensor> k_max_dim(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const int64_t d = wrap_dim(c.i(0), x.dim(), "max");
  DTR_CHECK(x.dim() == 0 || x.sizes()[d] > 0, "max: reducing dim ", d, " of size 0 in ", x.sizes());
  const Shape rd = x.dim() ? Shape{d} : Shape{};
  const Shape shape = reduced_shape(x.sizes(), rd, c.b(1));
  Tensor vals = cuda_empty(shape, x.dtype(), x);
  Tensor idx = cuda_empty(shape, DType::i64, x);
  if (vals.numel() == 0) return {vals, idx};
  DeviceGuard guard(x.device());
  int64_t rows, R;
  Tensor p = reduced_last(x, rd, rows, R);
  cudaStream_t s = cuda::current_stream();
  dispatch_numeric(x.dtype(), "max", [&](auto tag) {
    using T = decltype(tag);
    argmax_rows_kernel<T><<<static_cast<unsigned>(rows), threads_for_row(R), 0, s>>>(
        static_cast<const T*>(p.data_ptr()), static_cast<T*>(vals.data_ptr()), static_cast<int64_t*>(idx.data_ptr()),
        R);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {vals, idx};
}

/// out[o, idx[o, j], j] = g[o, j] over out = zeros [outer, n, inner].
template <class T>
__global__ void max_backward_kernel(const T* g, const int64_t* idx, T* out, int64_t outer, int64_t n, int64_t inner) {
  DTR_GRID_STRIDE_LOOP(e, outer * inner) {
    const int64_t o = e / inner, j = e % inner;
    out[(o * n + idx[e]) * inner + j] = g[e];
  }
}

/// inputs {g, idx} (keepdim shape), attrs {input shape, dim} -> zeros with g scattered at idx.
std::vector<Tensor> k_max_dim_backward(const OpCall& c) {
  const Tensor& g0 = c.inputs[0];
  const Shape& in = c.shape(0);
  const int64_t d = c.i(1);
  Tensor out = cuda_empty(in, g0.dtype(), g0);
  if (out.numel() == 0) return {out};
  DeviceGuard guard(g0.device());
  const Tensor g = cuda_contiguous(g0);
  const Tensor idx = cuda_contiguous(c.inputs[1]);
  DTR_CHECK(idx.dtype() == DType::i64, "max_backward: indices must be int64, got ", idx.dtype());
  cuda_zero(out);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= in[i];
  for (size_t i = d + 1; i < in.size(); ++i) inner *= in[i];
  const int64_t n = in.empty() ? 1 : in[d];
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(g.dtype(), "max_backward", [&](auto tag) {
    using T = decltype(tag);
    max_backward_kernel<T><<<blocks_for(outer * inner), kThreads, 0, s>>>(
        static_cast<const T*>(g.data_ptr()), static_cast<const int64_t*>(idx.data_ptr()),
        static_cast<T*>(out.data_ptr()), outer, n, inner);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

DTR_REGISTER_KERNEL("sum", DeviceType::CUDA, k_sum);
DTR_REGISTER_KERNEL("amax", DeviceType::CUDA, k_amax);
DTR_REGISTER_KERNEL("max_dim", DeviceType::CUDA, k_max_dim);
DTR_REGISTER_KERNEL("all", DeviceType::CUDA, logical_reduce<false>);
DTR_REGISTER_KERNEL("any", DeviceType::CUDA, logical_reduce<true>);
DTR_REGISTER_KERNEL("max_dim_backward", DeviceType::CUDA, k_max_dim_backward);

}  // namespace
}  // namespace dtr::cuda_ops
