#pragma once
// CUDA copies: strided copy with dtype conversion and fill on the device, and host<->device
// transfers. All work goes to the current stream of the tensor's device (cuda::current_stream).
// Conversions follow the CPU backend (tensor/ops/cpu/copy_kernel.cpp): to bf16/f16 through f32
// with round-to-nearest-even, from bf16/f16 through f32, to bool as v != 0, else static_cast.
#ifdef DTR_WITH_CUDA
#include "tensor/tensor.h"

namespace dtr::cuda {

/// dst[i] = convert(src[i]) for CUDA tensors on the same device, any strides and dtypes.
/// Shapes must be equal (expand src first to broadcast). Same dtype and both contiguous: one
/// cudaMemcpyAsync. Errors: different devices or shapes, more than 10 dims after merging
/// contiguous dims.
void copy_strided(Tensor& dst, const Tensor& src);
/// dst[i] = v converted to dst's dtype (the CPU conversion of a double), any strides.
void fill_strided(Tensor& dst, double v);
/// Copies CUDA `src` (any layout) into CPU `dst` (contiguous, same dtype and numel) and waits
/// for the copy. A non-contiguous src is made contiguous on its device first.
void copy_device_to_host(const Tensor& src, Tensor& dst);
/// Copies CPU `src` (contiguous) into CUDA `dst` (any layout, same dtype and numel) on dst's
/// current stream. Returns without waiting: pageable sources are staged by the driver before
/// the call returns; pinned sources (tensor/cuda/pinned_allocator.h) are recorded on the stream
/// so their block is not reused before the copy finished.
void copy_host_to_device(const Tensor& src, Tensor& dst);

}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
