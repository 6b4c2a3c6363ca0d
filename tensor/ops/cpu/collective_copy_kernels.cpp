// CPU kernels of chunk_cat and split_with_sizes_copy (bodies in ops/collective_copy_kernel.h):
// strided copies of views, no upcast (pure data movement, every dtype).
#include "tensor/ops/collective_copy_kernel.h"
#include "tensor/ops/cpu/copy_kernel.h"

namespace dtr {
namespace {

void copy_view(Tensor dst, const Tensor& src) { cpu::copy_strided(dst, src); }

std::vector<Tensor> k_chunk_cat(const OpCall& c) {
  return {collective_copy::chunk_cat(
      c, [](const Shape& s, const Tensor& like) { return empty(s, TensorOptions(like.dtype())); },
      [](Tensor& t) { cpu::fill_strided(t, 0.0); }, copy_view)};
}

std::vector<Tensor> k_split_with_sizes_copy(const OpCall& c) {
  collective_copy::split_with_sizes_copy(c, copy_view);
  return {};
}

DTR_REGISTER_KERNEL_EXACT("chunk_cat", DeviceType::CPU, k_chunk_cat);
DTR_REGISTER_KERNEL_EXACT("split_with_sizes_copy", DeviceType::CPU, k_split_with_sizes_copy);

}  // namespace
}  // namespace dtr
