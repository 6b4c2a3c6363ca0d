// CUDA strided copy / cast and fill kernels (see copy.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cuda/cuda_context.h"
#include "tensor/ops/cuda/copy.h"

namespace dtr::cuda {
namespace {

constexpr int kMaxDims = 10;
constexpr int kThreads = 256;

/// Sizes and element strides of up to two tensors over the same index space, with size-1
/// dims dropped and dims that are contiguous in both tensors merged (outermost first).
struct Layout {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t st0[kMaxDims];
  int64_t st1[kMaxDims];
};

Layout make_layout(const Shape& sizes, const Shape& s0, const Shape& s1, const char* op) {
  struct Dim {
    int64_t size, a, b;
  };
  std::vector<Dim> dims;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) continue;
    const Dim d{sizes[i], s0[i], s1[i]};
    if (!dims.empty() && dims.back().a == d.a * d.size && dims.back().b == d.b * d.size) {
      dims.back() = {dims.back().size * d.size, d.a, d.b};
    } else {
      dims.push_back(d);
    }
  }
  if (dims.empty()) dims.push_back({1, 1, 1});
  DTR_CHECK(static_cast<int>(dims.size()) <= kMaxDims, op, ": ", dims.size(),
            " non-mergeable dims exceed the CUDA copy limit of ", kMaxDims, " (shape ", sizes, ")");
  Layout L;
  L.ndim = static_cast<int>(dims.size());
  for (int i = 0; i < L.ndim; ++i) {
    L.sizes[i] = dims[i].size;
    L.st0[i] = dims[i].a;
    L.st1[i] = dims[i].b;
  }
  return L;
}

/// Element offsets (in tensor 0 and tensor 1) of linear index i (row-major over L.sizes).
__device__ __forceinline__ void offsets(const Layout& L, int64_t i, int64_t& o0, int64_t& o1) {
  o0 = 0;
  o1 = 0;
  for (int d = L.ndim - 1; d >= 0; --d) {
    const int64_t idx = i % L.sizes[d];
    i /= L.sizes[d];
    o0 += idx * L.st0[d];
    o1 += idx * L.st1[d];
  }
}

template <class T>
constexpr bool is_half_like = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

template <class T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else {
    return static_cast<float>(v);
  }
}

/// The CPU backend's conversion rules (tensor/ops/cpu/copy_kernel.cpp, convert<To, From>).
template <class To, class From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(to_float(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(to_float(v));
  } else if constexpr (is_half_like<From>) {
    const float f = to_float(v);
    if constexpr (std::is_same_v<To, bool>) {
      return f != 0.0f;
    } else {
      return static_cast<To>(f);
    }
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

template <class To, class From>
__global__ void copy_kernel(To* __restrict__ dst, const From* __restrict__ src, int64_t n, Layout L) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t o0, o1;
    offsets(L, i, o0, o1);
    dst[o0] = convert<To>(src[o1]);
  }
}

/// Fills with a bit pattern of the element size (the value was converted on the host).
template <class Word>
__global__ void fill_kernel(Word* __restrict__ dst, Word value, int64_t n, Layout L) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t o0, o1;
    offsets(L, i, o0, o1);
    dst[o0] = value;
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (int64_t{1} << 20) ? blocks : (int64_t{1} << 20));
}

/// Calls f(T{}) with the device element type of `dt`.
template <class F>
void dispatch_device_type(DType dt, F&& f) {
  switch (dt) {
    case DType::f64: f(double{}); return;
    case DType::f32: f(float{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::f16: f(__half{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::u8: f(uint8_t{}); return;
    case DType::bool_: f(bool{}); return;
  }
  DTR_ERROR("cuda copy: unknown dtype ", static_cast<int>(dt));
}

}  // namespace

void copy_strided(Tensor& dst, const Tensor& src) {
  DTR_CHECK(dst.device().is_cuda() && src.device() == dst.device(), "cuda copy: dst on ", dst.device(), ", src on ",
            src.device(), " (expected the same CUDA device)");
  DTR_CHECK(dst.sizes() == src.sizes(), "cuda copy: shape ", src.sizes(), " into ", dst.sizes());
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device().index);
  cudaStream_t stream = current_stream();
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    DTR_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const Layout L = make_layout(dst.sizes(), dst.strides(), src.strides(), "cuda copy");
  dispatch_device_type(dst.dtype(), [&](auto to_tag) {
    using To = decltype(to_tag);
    dispatch_device_type(src.dtype(), [&](auto from_tag) {
      using From = decltype(from_tag);
      copy_kernel<To, From><<<grid_for(n), kThreads, 0, stream>>>(static_cast<To*>(dst.data_ptr()),
                                                                   static_cast<const From*>(src.data_ptr()), n, L);
    });
  });
  DTR_CUDA_CHECK(cudaGetLastError());
}

void fill_strided(Tensor& dst, double v) {
  DTR_CHECK(dst.device().is_cuda(), "cuda fill: tensor on ", dst.device());
  const int64_t n = dst.numel();
  if (n == 0) return;
  // The value in dst's dtype, converted on the host exactly like the CPU backend.
  uint64_t bits = 0;
  switch (dst.dtype()) {
    case DType::f64: std::memcpy(&bits, &v, 8); break;
    case DType::f32: { const float f = static_cast<float>(v); std::memcpy(&bits, &f, 4); break; }
    case DType::bf16: bits = bf16(static_cast<float>(v)).bits; break;
    case DType::f16: bits = f16(static_cast<float>(v)).bits; break;
    case DType::i64: { const int64_t x = static_cast<int64_t>(v); std::memcpy(&bits, &x, 8); break; }
    case DType::i32: { const int32_t x = static_cast<int32_t>(v); std::memcpy(&bits, &x, 4); break; }
    case DType::u8: bits = static_cast<uint8_t>(v); break;
    case DType::bool_: bits = v != 0.0 ? 1 : 0; break;
  }
  DeviceGuard guard(dst.device().index);
  cudaStream_t stream = current_stream();
  const Layout L = make_layout(dst.sizes(), dst.strides(), dst.strides(), "cuda fill");
  void* p = dst.data_ptr();
  switch (itemsize(dst.dtype())) {
    case 1: fill_kernel<uint8_t><<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint8_t*>(p), static_cast<uint8_t>(bits), n, L); break;
    case 2: fill_kernel<uint16_t><<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint16_t*>(p), static_cast<uint16_t>(bits), n, L); break;
    case 4: fill_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint32_t*>(p), static_cast<uint32_t>(bits), n, L); break;
    case 8: fill_kernel<uint64_t><<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint64_t*>(p), bits, n, L); break;
    default: DTR_ERROR("cuda fill: unsupported element size ", itemsize(dst.dtype()));
  }
  DTR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtr::cuda
