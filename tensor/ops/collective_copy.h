#pragma once
// Copy-in / copy-out ops of collectives (FSDP's flat reduce-scatter and all-gather buffers),
// with CPU and CUDA kernels. Source: PyTorch torch._chunk_cat, torch.split_with_sizes_copy.
#include <vector>

#include "tensor/tensor.h"

namespace dtr {

/// torch._chunk_cat(xs, dim=0, num_chunks): each x_i [rows_i, ...] is split along dim 0 into
/// num_chunks chunks of ceil(rows_i / num_chunks) rows (torch.chunk; short / empty last chunks
/// zero padded to that size) and row c of the result [num_chunks, sum_i chunk_numel_i] is the
/// concatenation of every x_i's chunk c, flattened. FSDP's reduce-scatter input.
/// Errors: an empty list, num_chunks < 1, 0-d / distributed tensors, mixed dtypes or devices,
/// inputs that require grad with grad mode on (not differentiable).
Tensor chunk_cat(const std::vector<Tensor>& xs, int64_t num_chunks);
/// torch.split_with_sizes_copy(src, sizes, dim, out=outs): outs[j] <- the j-th piece of src
/// along `dim` (pieces of sizes[j]); outs may be strided views (e.g. of a padded parameter
/// buffer). Bumps each output's version (an in-place write). FSDP's all-gather copy-out.
/// Errors: sizes not summing to src.size(dim), an output of another shape / dtype / device.
void split_with_sizes_copy(const Tensor& src, const Shape& sizes, int64_t dim, const std::vector<Tensor>& outs);

}  // namespace dtr
