// CUDA kernel of dropout with the CPU's Philox numbers (tensor/random.cpp,
// ops/cpu/nn_dropout_kernels.cpp): element i (row-major; with attrs {global_shape,
// local_offset}, the row-major index in the global tensor) is kept when
// philox_uniform(seed, offset + i) >= p, i.e. block (offset + i) / 4 of Philox 4x32-10 keyed
// by seed, word (offset + i) % 4, top 24 bits times 2^-24, compared in double. The
// integer arithmetic is exact, so the CUDA mask equals the CPU mask bit for bit; kept
// values are x * (1 / (1 - p)) in f32 (f64 for f64), rounded once like the CPU's upcast.
#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"
#include "tensor/ops/cuda/philox.cuh"

namespace dtr::cuda_ops {
namespace {

/// Local row-major index -> global row-major index (shard of a global tensor).
struct GlobalIndex {
  int ndim = 0;  // 0: identity
  int64_t lshape[kMaxDims] = {};
  int64_t goff[kMaxDims] = {};
  int64_t gstride[kMaxDims] = {};
  __device__ __forceinline__ uint64_t operator()(int64_t i) const {
    if (ndim == 0) return static_cast<uint64_t>(i);
    int64_t g = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      g += (i % lshape[d] + goff[d]) * gstride[d];
      i /= lshape[d];
    }
    return static_cast<uint64_t>(g);
  }
};

template <class T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, double p, uint64_t seed, uint64_t offset,
                               GlobalIndex gi, acc_t<T> scale) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    const bool keep = static_cast<double>(philox_uniform_hd(seed, offset + gi(i))) >= p;
    out[i] = keep ? store<T>(load(x[i]) * scale) : store<T>(acc_t<T>(0));
  }
}

/// inputs {x}, attrs {p, seed, offset[, global_shape, local_offset]}.
std::vector<Tensor> k_dropout(const OpCall& c) {
  const Tensor& x0 = c.inputs[0];
  const double p = c.f(0);
  const uint64_t seed = static_cast<uint64_t>(c.i(1)), offset = static_cast<uint64_t>(c.i(2));
  Tensor out = cuda_empty(x0.sizes(), x0.dtype(), x0);
  const int64_t n = x0.numel();
  GlobalIndex gi;
  if (c.attrs.size() >= 5) {
    const Shape& gshape = c.shape(3);
    const Shape& goff = c.shape(4);
    const Shape& lshape = x0.sizes();
    DTR_CHECK(gshape.size() == lshape.size() && goff.size() == lshape.size(), "dropout: global shape ", gshape,
              " / offset ", goff, " do not match the local shape ", lshape);
    DTR_CHECK(static_cast<int>(lshape.size()) <= kMaxDims, "dropout: CUDA kernel supports at most ", kMaxDims,
              " dims, got ", lshape);
    const Shape gstride = contiguous_strides(gshape);
    gi.ndim = static_cast<int>(lshape.size());
    for (int d = 0; d < gi.ndim; ++d) {
      gi.lshape[d] = lshape[d];
      gi.goff[d] = goff[d];
      gi.gstride[d] = gstride[d];
    }
  }
  if (n == 0) return {out};
  DeviceGuard guard(x0.device());
  const Tensor x = cuda_contiguous(x0);
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(x.data_ptr()),
                                                         static_cast<T*>(out.data_ptr()), n, p, seed, offset, gi,
                                                         static_cast<acc_t<T>>(1.0 / (1.0 - p)));
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

DTR_REGISTER_KERNEL("dropout", DeviceType::CUDA, k_dropout);

}  // namespace
}  // namespace dtr::cuda_ops
