// CPU kernel of dropout: out[i] = x[i] * (philox_uniform(seed, offset + i) >= p) / (1 - p),
// i the logical row-major index (any input strides).
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/random.h"

namespace dtr {
namespace {

std::vector<Tensor> k_dropout(const OpCall& c) {
  const Tensor& in = c.inputs[0];
  Tensor x = in.is_contiguous() ? in : contiguous(in.detach());
  const double p = c.f(0);
  const uint64_t seed = static_cast<uint64_t>(c.i(1)), offset = static_cast<uint64_t>(c.i(2));
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  const int64_t n = x.numel();
  cpu::dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const T scale = static_cast<T>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain / 8)
    for (int64_t i = 0; i < n; ++i)
      po[i] = static_cast<double>(philox_uniform(seed, offset + static_cast<uint64_t>(i))) >= p ? px[i] * scale : T(0);
  });
  return {out};
}

DTR_REGISTER_KERNEL("dropout", DeviceType::CPU, k_dropout);

}  // namespace
}  // namespace dtr
