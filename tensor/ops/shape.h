#pragma once
// Shape helpers shared by ops and kernels: broadcasting, reduction dims.
#include <vector>

#include "tensor/tensor.h"

namespace dtr {

/// The broadcast of two shapes (right-aligned, size-1 dims stretch). Errors name `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
/// Normalised, sorted, unique reduction dims (all dims when `dims` is empty).
Shape reduction_dims(const Shape& dims, int64_t ndim, const char* op);
/// The shape after reducing `dims` (kept as 1 when keepdim).
Shape reduced_shape(const Shape& shape, const Shape& dims, bool keepdim);
/// A view of x with the kept dims first and `dims` (normalised) last, in that order; sets rows =
/// product of kept sizes and R = product of reduced sizes. No copy: kernels make it contiguous
/// on their device.
Tensor reduced_last_view(const Tensor& x, const Shape& dims, int64_t& rows, int64_t& R);
/// Checks that a and b have the same dtype (floating ops do not promote in dtr).
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);
/// In-place ops refuse tensors that require grad while grad mode is on (error names `op`).
void check_inplace(const Tensor& t, const char* op);

}  // namespace dtr
