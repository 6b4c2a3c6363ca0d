// Copies and casts: to_dtype, to_device, clone, contiguous, copy_, fill_, zero_, and the
// gradient of slicing (slice_backward).
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/shape.h"
#include "tensor/meta.h"
#include "tensor/ops/cpu/copy_kernel.h"

namespace dtr {
namespace {

std::vector<Tensor> k_to_dtype(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  Tensor out = empty(x.sizes(), TensorOptions(c.dtype(0)));
  cpu::copy_strided(out, x);
  return {out};
}

std::vector<Tensor> k_clone(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
  cpu::copy_strided(out, x);
  return {out};
}

std::vector<Tensor> k_to_device(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Device d{static_cast<DeviceType>(c.i(0)), static_cast<int>(c.i(1))};
  if (d == x.device()) return {x};
  static const OpDef* h2d = op_def("copy_host_to_device");
  Kernel k = h2d->kernels[static_cast<int>(DeviceType::CUDA)];
  DTR_CHECK(k != nullptr, "to_device: no CUDA backend in this build, cannot move ", x.sizes(), " to ", d);
  return k(c);
}

std::vector<Tensor> k_copy_(const OpCall& c) {
  Tensor dst = c.inputs[0];
  cpu::copy_strided(dst, c.inputs[1].expand(dst.sizes()));
  return {dst};
}

std::vector<Tensor> k_fill_(const OpCall& c) {
  Tensor dst = c.inputs[0];
  cpu::fill_strided(dst, c.f(0));
  return {dst};
}

std::vector<Tensor> k_slice_backward(const OpCall& c) {
  const Tensor& g = c.inputs[0];
  Tensor out = empty(c.shape(0), TensorOptions(g.dtype()));
  cpu::fill_strided(out, 0.0);
  // Write g into the sliced region of out (a strided view).
  Shape sz = out.sizes(), st = out.strides();
  const int64_t d = c.i(1), start = c.i(2), step = c.i(4);
  sz[d] = g.sizes()[d];
  st[d] *= step;
  Tensor region = make_view(out, sz, st, start * out.strides()[d]);
  cpu::copy_strided(region, g);
  return {out};
}

DTR_REGISTER_KERNEL_EXACT("to_dtype", DeviceType::CPU, k_to_dtype);
DTR_REGISTER_KERNEL_EXACT("clone", DeviceType::CPU, k_clone);
DTR_REGISTER_KERNEL_EXACT("to_device", DeviceType::CPU, k_to_device);
DTR_REGISTER_KERNEL_EXACT("copy_", DeviceType::CPU, k_copy_);
DTR_REGISTER_KERNEL_EXACT("fill_", DeviceType::CPU, k_fill_);
DTR_REGISTER_KERNEL_EXACT("slice_backward", DeviceType::CPU, k_slice_backward);

}  // namespace

Tensor to_dtype(const Tensor& x, DType dt) {
  static const OpDef* op = op_def("to_dtype");
  Tensor out = dispatch1(OpCall{op, {x}, {dt}});
  if (needs_grad({x}) && is_floating(dt)) {
    record("to_dtype", {x}, out, [src = x.dtype()](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{to_dtype(g[0], src)};
    });
  }
  return out;
}

Tensor to_device(const Tensor& x, Device d) {
  static const OpDef* op = op_def("to_device");
  Tensor out = dispatch1(OpCall{op, {x}, {static_cast<int64_t>(d.type), static_cast<int64_t>(d.index)}});
  if (needs_grad({x})) {
    record("to_device", {x}, out, [src = x.device()](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{to_device(g[0], src)};
    });
  }
  return out;
}

Tensor clone(const Tensor& x) {
  static const OpDef* op = op_def("clone");
  Tensor out = dispatch1(OpCall{op, {x}, {}});
  if (needs_grad({x})) {
    record("clone", {x}, out,
           [](const std::vector<Tensor>& g, const std::vector<bool>&) { return std::vector<Tensor>{g[0]}; });
  }
  return out;
}

Tensor contiguous(const Tensor& x) {
  if (!x.is_distributed() && x.is_contiguous()) return x;
  return clone(x);
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  if (is_meta(*this)) {  // building under MetaInitGuard: the recipe changes, no data moves
    meta_detail::copy_into_meta(*this, src);
    return *this;
  }
  static const OpDef* op = op_def("copy_");
  // Across devices (e.g. CPU -> CUDA): move src to this tensor's device, then copy there.
  const bool cross = !is_distributed() && !src.is_distributed() && src.device() != device();
  dispatch(OpCall{op, {*this, cross ? src.detach().to(device()) : src}, {}});
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(double v) {
  check_inplace(*this, "fill_");
  if (is_meta(*this)) {
    meta_detail::fill_meta(*this, v);
    return *this;
  }
  static const OpDef* op = op_def("fill_");
  dispatch(OpCall{op, {*this}, {v}});
  bump_version();
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

}  // namespace dtr
