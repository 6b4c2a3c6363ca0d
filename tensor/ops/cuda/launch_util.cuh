#pragma once
// Shared helpers of dtr's CUDA kernels (included by tensor/ops/cuda/*.cu only):
//   - element types: C++ types of the floating dtypes on the device (__nv_bfloat16, __half),
//     their f32 (f64 for double) accumulation type, load/store conversions;
//   - dispatch_floating / dispatch_numeric: call a generic host lambda with the element type;
//   - OffsetCalc<N> (offset_calc.h): row-major linear index -> element offsets of N operands
//     with arbitrary (broadcast / zero) strides, after coalescing dims on the host;
//   - launch geometry: grid-stride loops, blocks_for(n);
//   - block reductions (sum / max) with warp shuffles;
//   - DeviceGuard (runs a kernel on the device of its tensors), cuda_empty (outputs on the
//     device of an input), check_indices (range check of id / target tensors with one sync).
// Every kernel runs on dtr::cuda::current_stream() and is checked with DTR_CUDA_CHECK.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/cuda/cuda_context.h"
#include "tensor/ops/cuda/offset_calc.h"
#include "tensor/tensor.h"

namespace dtr::cuda_ops {

// ---- element types ---------------------------------------------------------------------------

/// Accumulation / math type of an element type: f64 for double, f32 for f32/bf16/f16, the
/// type itself for integers.
template <class T> struct AccOf { using type = T; };
template <> struct AccOf<__nv_bfloat16> { using type = float; };
template <> struct AccOf<__half> { using type = float; };
template <class T> using acc_t = typename AccOf<T>::type;

/// DType of an accumulation type (for temporary buffers of partial results).
template <class A>
constexpr DType dtype_of_acc() {
  if constexpr (std::is_same_v<A, double>) return DType::f64;
  else if constexpr (std::is_same_v<A, float>) return DType::f32;
  else if constexpr (std::is_same_v<A, int64_t>) return DType::i64;
  else return DType::i32;
}

/// Element -> math type (exact for every dtype).
template <class T>
__device__ __forceinline__ acc_t<T> load(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return v;
}
/// Math type -> element (round to nearest even for bf16 / f16, like the CPU's bf16(float)).
template <class T, class A>
__device__ __forceinline__ T store(A v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(static_cast<float>(v));
  else return static_cast<T>(v);
}

/// Largest-magnitude negative value of a math type (identity of max): -inf for floats.
template <class A>
__host__ __device__ constexpr A lowest_of() {
  if constexpr (std::is_floating_point_v<A>) return -std::numeric_limits<A>::infinity();
  else return std::numeric_limits<A>::lowest();
}

/// Calls f(T{}) with T the device element type of floating dtype `dt` (f32, f64, bf16, f16).
template <class F>
void dispatch_floating(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    case DType::bf16: f(__nv_bfloat16{}); break;
    case DType::f16: f(__half{}); break;
    default: DTR_ERROR(op, ": unsupported dtype ", dt, " on CUDA (expected f32, f64, bf16 or f16)");
  }
}
/// dispatch_floating plus i64 / i32 (the CPU's dispatch_numeric set, with bf16 / f16).
template <class F>
void dispatch_numeric(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::i64: f(int64_t{}); break;
    case DType::i32: f(int32_t{}); break;
    default: dispatch_floating(dt, op, f);
  }
}

/// Strides of `t` viewed with `shape` (t broadcast to it: new and stretched dims get stride 0).
Shape broadcast_strides_to(const Tensor& t, const Shape& shape);

// ---- launch geometry ------------------------------------------------------------------------

constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n elements (at least 1; capped, the loop covers the rest).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (int64_t{1} << 20) ? (int64_t{1} << 20) : b));
}

/// Threads per block for reducing rows of length R with one block per row: a multiple of 32
/// in [32, 256], not much larger than R.
inline int threads_for_row(int64_t R) {
  int t = 32;
  while (t < kThreads && t < R) t *= 2;
  return t;
}

#define DTR_GRID_STRIDE_LOOP(i, n)                                                               \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);         \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

/// Checks the launch just made (configuration errors surface here, faults at the next sync).
#define DTR_CUDA_CHECK_LAUNCH() DTR_CUDA_CHECK(cudaGetLastError())

// ---- block reductions -----------------------------------------------------------------------

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class A>
__device__ __forceinline__ A max_of(A a, A b) {
  return a < b ? b : a;  // like std::max: a NaN first argument is kept, a NaN second is not
}
template <class A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max_of(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
/// Uses 33 slots of shared memory; safe to call repeatedly in one kernel.
template <class A>
__device__ A block_sum(A v) {
  __shared__ A sh[33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading sh
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A w = lane < nw ? sh[lane] : A(0);
    w = warp_sum(w);
    if (lane == 0) sh[32] = w;
  }
  __syncthreads();
  return sh[32];
}
/// Max over the block; identity lowest_of<A>(); every thread gets the result.
template <class A>
__device__ A block_max(A v) {
  __shared__ A sh[33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A w = lane < nw ? sh[lane] : lowest_of<A>();
    w = warp_max(w);
    if (lane == 0) sh[32] = w;
  }
  __syncthreads();
  return sh[32];
}

// ---- host helpers ---------------------------------------------------------------------------

/// Makes the device of `d` current for the guard's lifetime (kernels and current_stream()
/// then target that device); restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device d);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

/// A new contiguous tensor on `like`'s device.
inline Tensor cuda_empty(const Shape& shape, DType dt, const Tensor& like) {
  return empty(shape, TensorOptions(dt).with_device(like.device()));
}

/// `t` itself when contiguous, else a contiguous copy made by a CUDA kernel (same dtype).
Tensor cuda_contiguous(const Tensor& t);
/// dst <- src elementwise (same shape and dtype, any strides; dst must not overlap src).
void cuda_copy_same_dtype(const Tensor& dst, const Tensor& src, const char* op);
/// Sets every byte of contiguous `t` to 0 on the current stream.
void cuda_zero(const Tensor& t);

/// Checks that every element of the integer (i64 / i32) CUDA tensor `ids` (contiguous) lies in
/// [0, hi) or equals `ignore` (pass a value outside the int64 range used, e.g. INT64_MIN, for none).
/// One kernel plus one synchronisation of the current stream. Errors: the first bad position,
/// its value, `what` (e.g. "id ... out of range for vocab size") naming `op`.
void check_indices(const Tensor& ids, int64_t hi, int64_t ignore, const char* op, const char* what);

}  // namespace dtr::cuda_ops
