// CPU kernel of cat: each input is copied into its slice of the output (strided copy).
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/copy_kernel.h"

namespace dtr {
namespace {

std::vector<Tensor> k_cat(const OpCall& c) {
  const int64_t d = c.i(0);
  const Tensor& ref = c.inputs[0];
  Shape shape = ref.sizes();
  shape[d] = 0;
  for (const Tensor& t : c.inputs) shape[d] += t.sizes()[d];
  Tensor out = empty(shape, TensorOptions(ref.dtype()));
  int64_t off = 0;
  for (const Tensor& t : c.inputs) {
    Shape sz = shape;
    sz[d] = t.sizes()[d];
    Tensor dst = make_view(out, sz, out.strides(), off * out.strides()[d]);
    if (t.numel() > 0) cpu::copy_strided(dst, t);
    off += sz[d];
  }
  return {out};
}

DTR_REGISTER_KERNEL("cat", DeviceType::CPU, k_cat);

}  // namespace
}  // namespace dtr
