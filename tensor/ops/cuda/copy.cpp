// CUDA kernels of the copy ops (to_device, copy_host_to_device, to_dtype, clone, copy_, fill_,
// full_like, slice_backward) and host<->device transfers. The ops' public functions and
// autograd live in tensor/ops/copy.cpp; the CPU kernel of to_device calls
// copy_host_to_device here for CPU -> CUDA.
#include "tensor/ops/cuda/copy.h"

#ifdef DTR_WITH_CUDA
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/pinned_allocator.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr::cuda {

void copy_device_to_host(const Tensor& src, Tensor& dst) {
  DTR_CHECK(src.device().is_cuda() && dst.device().is_cpu() && dst.is_contiguous() && src.dtype() == dst.dtype() &&
                src.numel() == dst.numel(),
            "copy_device_to_host: src ", src.sizes(), " ", src.dtype(), " on ", src.device(), ", dst ", dst.sizes(), " ",
            dst.dtype(), " on ", dst.device(), " (expected CUDA -> contiguous CPU, same dtype and numel)");
  if (src.numel() == 0) return;
  const Tensor s = src.is_contiguous() ? src : src.contiguous();
  DeviceGuard guard(s.device().index);
  cudaStream_t stream = current_stream();
  DTR_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), s.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToHost, stream));
  DTR_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void copy_host_to_device(const Tensor& src, Tensor& dst) {
  DTR_CHECK(src.device().is_cpu() && src.is_contiguous() && dst.device().is_cuda() && src.dtype() == dst.dtype() &&
                src.numel() == dst.numel(),
            "copy_host_to_device: src ", src.sizes(), " ", src.dtype(), " on ", src.device(), ", dst ", dst.sizes(),
            " ", dst.dtype(), " on ", dst.device(), " (expected contiguous CPU -> CUDA, same dtype and numel)");
  if (src.numel() == 0) return;
  DeviceGuard guard(dst.device().index);
  cudaStream_t stream = current_stream();
  Tensor target = dst.is_contiguous() ? dst : empty(dst.sizes(), TensorOptions(dst.dtype()).with_device(dst.device()));
  DTR_CUDA_CHECK(cudaMemcpyAsync(target.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyHostToDevice, stream));
  if (src.storage() && is_pinned(src.storage()->data())) pinned_record_stream(src.storage()->data(), stream);
  if (!target.is_same(dst)) copy_strided(dst, target);
}

namespace {

Device target_device(const OpCall& c) { return {static_cast<DeviceType>(c.i(0)), static_cast<int>(c.i(1))}; }

/// to_device for a CUDA input: CUDA -> CPU, or CUDA -> another CUDA device.
std::vector<Tensor> k_to_device(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Device d = target_device(c);
  if (d == x.device()) return {x};
  if (d.is_cpu()) {
    Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
    copy_device_to_host(x, out);
    return {out};
  }
  const Tensor src = x.contiguous();
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()).with_device(d));
  if (x.numel() == 0) return {out};
  {
    // out's block may be a cached one still read by work queued on d's stream: wait for it.
    DeviceGuard g(d.index);
    DTR_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  }
  DeviceGuard g(src.device().index);
  cudaStream_t stream = current_stream();
  DTR_CUDA_CHECK(cudaMemcpyPeerAsync(out.data_ptr(), d.index, src.data_ptr(), src.device().index, src.nbytes(), stream));
  DTR_CUDA_CHECK(cudaStreamSynchronize(stream));
  return {out};
}

/// CPU -> CUDA, called by the CPU kernel of to_device (inputs[0] is the CPU tensor).
std::vector<Tensor> k_copy_host_to_device(const OpCall& c) {
  const Tensor x = c.inputs[0].contiguous();
  const Device d = target_device(c);
  DTR_CHECK(d.is_cuda(), "to_device: copy_host_to_device called for target ", d);
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()).with_device(d));
  copy_host_to_device(x, out);
  return {out};
}

std::vector<Tensor> k_to_dtype(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  Tensor out = empty(x.sizes(), TensorOptions(c.dtype(0)).with_device(x.device()));
  copy_strided(out, x);
  return {out};
}

std::vector<Tensor> k_clone(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()).with_device(x.device()));
  copy_strided(out, x);
  return {out};
}

std::vector<Tensor> k_copy_(const OpCall& c) {
  Tensor dst = c.inputs[0];
  copy_strided(dst, c.inputs[1].expand(dst.sizes()));
  return {dst};
}

std::vector<Tensor> k_fill_(const OpCall& c) {
  Tensor dst = c.inputs[0];
  fill_strided(dst, c.f(0));
  return {dst};
}

std::vector<Tensor> k_full_like(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  Tensor out = empty(x.sizes(), TensorOptions(x.dtype()).with_device(x.device()));
  fill_strided(out, c.f(0));
  return {out};
}

/// Gradient of slice: zeros of the input shape with g written into the sliced region
/// (attrs as the CPU kernel: shape, dim, start, end, step).
std::vector<Tensor> k_slice_backward(const OpCall& c) {
  const Tensor& g = c.inputs[0];
  Tensor out = empty(c.shape(0), TensorOptions(g.dtype()).with_device(g.device()));
  fill_strided(out, 0.0);
  Shape sz = out.sizes(), st = out.strides();
  const int64_t d = c.i(1), start = c.i(2), step = c.i(4);
  sz[d] = g.sizes()[d];
  st[d] *= step;
  Tensor region = make_view(out, sz, st, start * out.strides()[d]);
  copy_strided(region, g);
  return {out};
}

DTR_REGISTER_KERNEL("to_device", DeviceType::CUDA, k_to_device);
DTR_REGISTER_KERNEL("copy_host_to_device", DeviceType::CUDA, k_copy_host_to_device);
DTR_REGISTER_KERNEL("to_dtype", DeviceType::CUDA, k_to_dtype);
DTR_REGISTER_KERNEL("clone", DeviceType::CUDA, k_clone);
DTR_REGISTER_KERNEL("copy_", DeviceType::CUDA, k_copy_);
DTR_REGISTER_KERNEL("fill_", DeviceType::CUDA, k_fill_);
DTR_REGISTER_KERNEL("full_like", DeviceType::CUDA, k_full_like);
DTR_REGISTER_KERNEL("slice_backward", DeviceType::CUDA, k_slice_backward);

}  // namespace
}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
