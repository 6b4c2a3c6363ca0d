// CUDA kernels of chunk_cat and split_with_sizes_copy (bodies in ops/collective_copy_kernel.h):
// the same views as the CPU kernels, copied by the strided same-dtype copy of launch_util on
// the tensors' device and stream; padding zeroed with one memset.
#include "tensor/ops/collective_copy_kernel.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

std::vector<Tensor> k_chunk_cat(const OpCall& c) {
  DeviceGuard guard(c.inputs[0].device());
  return {collective_copy::chunk_cat(
      c, [](const Shape& s, const Tensor& like) { return cuda_empty(s, like.dtype(), like); },
      [](const Tensor& t) { cuda_zero(t); },
      [](const Tensor& dst, const Tensor& src) { cuda_copy_same_dtype(dst, src, "chunk_cat"); })};
}

std::vector<Tensor> k_split_with_sizes_copy(const OpCall& c) {
  DeviceGuard guard(c.inputs[0].device());
  collective_copy::split_with_sizes_copy(
      c, [](const Tensor& dst, const Tensor& src) { cuda_copy_same_dtype(dst, src, "split_with_sizes_copy"); });
  return {};
}

DTR_REGISTER_KERNEL("chunk_cat", DeviceType::CUDA, k_chunk_cat);
DTR_REGISTER_KERNEL("split_with_sizes_copy", DeviceType::CUDA, k_split_with_sizes_copy);

}  // namespace
}  // namespace dtr::cuda_ops
