// CUDA kernel of cat (the only shape op that is not a view): each input is copied into its
// slice of the output by the strided same-dtype copy of launch_util. Same semantics as
// ops/cpu/shape_ops_kernels.cpp (the front-end in ops/shape_ops.cpp checks shapes / dtypes).
#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

std::vector<Tensor> k_cat(const OpCall& c) {
  const int64_t d = c.i(0);
  const Tensor& ref = c.inputs[0];
  Shape shape = ref.sizes();
  shape[d] = 0;
  for (const Tensor& t : c.inputs) shape[d] += t.sizes()[d];
  Tensor out = cuda_empty(shape, ref.dtype(), ref);
  int64_t off = 0;
  for (const Tensor& t : c.inputs) {
    Shape sz = shape;
    sz[d] = t.sizes()[d];
    const Tensor dst = make_view(out, sz, out.strides(), off * out.strides()[d]);
    if (t.numel() > 0) cuda_copy_same_dtype(dst, t, "cat");
    off += sz[d];
  }
  return {out};
}

DTR_REGISTER_KERNEL("cat", DeviceType::CUDA, k_cat);

}  // namespace
}  // namespace dtr::cuda_ops
