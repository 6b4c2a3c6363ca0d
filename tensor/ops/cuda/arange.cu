// CUDA kernel of arange (see ops/factory.cpp): out[i] = start + i * step in f64, converted to
// out's dtype as the CPU kernel converts (through f32 for bf16 / f16, round to nearest even).
#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

template <class T>
__global__ void arange_kernel(T* __restrict__ out, double start, double step, int64_t n) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    const double v = start + static_cast<double>(i) * step;
    if constexpr (std::is_integral_v<T>) out[i] = static_cast<T>(v);
    else out[i] = store<T>(static_cast<acc_t<T>>(v));
  }
}

std::vector<Tensor> k_arange(const OpCall& c) {
  const Tensor& out = c.inputs[0];
  DTR_CHECK(out.is_contiguous(), "arange: expected a contiguous CUDA output");
  const int64_t n = out.numel();
  if (n == 0) return {out};
  DeviceGuard guard(out.device());
  dispatch_numeric(out.dtype(), "arange", [&](auto tag) {
    using T = decltype(tag);
    arange_kernel<T><<<blocks_for(n), kThreads, 0, cuda::current_stream()>>>(static_cast<T*>(out.data_ptr()),
                                                                              c.f(0), c.f(1), n);
    DTR_CUDA_CHECK_LAUNCH();
  });
  return {out};
}

DTR_REGISTER_KERNEL("arange", DeviceType::CUDA, k_arange);

}  // namespace
}  // namespace dtr::cuda_ops
