#pragma once
// Strided copy with dtype conversion, and fill, for CPU tensors of any dtype.
#include "tensor/tensor.h"

namespace dtr::cpu {

/// dst[i] = convert(src[i]) for all elements; shapes must match (broadcast src first).
void copy_strided(Tensor& dst, const Tensor& src);
/// dst[i] = v converted to dst's dtype.
void fill_strided(Tensor& dst, double v);

}  // namespace dtr::cpu
