// CPU kernel of dropout: out[i] = x[i] * (philox_uniform(seed, offset + i) >= p) / (1 - p),
// i the logical row-major index (any input strides). With the optional attrs {global_shape,
// local_offset} (set by the DTensor rule for a shard of a distributed tensor) i is the
// row-major index of the element in the global tensor, so every shard draws its slice of the
// single-process mask.
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
  // Shard of a global tensor: global index of local element i (row-major over local dims).
  const bool global = c.attrs.size() >= 5;
  const Shape gshape = global ? c.shape(3) : Shape{};
  const Shape goff = global ? c.shape(4) : Shape{};
  const Shape lshape = x.sizes();
  const Shape gstride = contiguous_strides(gshape);
  DTR_CHECK(!global || (gshape.size() == lshape.size() && goff.size() == lshape.size()), "dropout: global shape ",
            gshape, " / offset ", goff, " do not match the local shape ", lshape);
  auto index = [&](int64_t i) -> uint64_t {
    if (!global) return static_cast<uint64_t>(i);
    int64_t g = 0;
    for (int64_t d = static_cast<int64_t>(lshape.size()) - 1; d >= 0; --d) {
      g += (i % lshape[d] + goff[d]) * gstride[d];
      i /= lshape[d];
    }
    return static_cast<uint64_t>(g);
  };
  cpu::dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const T scale = static_cast<T>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain / 8)
    for (int64_t i = 0; i < n; ++i)
      po[i] = static_cast<double>(philox_uniform(seed, offset + index(i))) >= p ? px[i] * scale : T(0);
  });
  return {out};
}

DTR_REGISTER_KERNEL("dropout", DeviceType::CPU, k_dropout);

}  // namespace
}  // namespace dtr
