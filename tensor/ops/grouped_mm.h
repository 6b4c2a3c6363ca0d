#pragma once
// grouped_mm's checks and autograd node on their own (ops.h has grouped_mm itself), for a fused
// kernel that computes a grouped_mm's value together with what follows it (grouped_mm_swiglu,
// tensor/ops/nn_swiglu.h) and should have grouped_mm's backward.
#include "tensor/tensor.h"

namespace dtr {

/// The shape / dtype / group-size checks of grouped_mm(a, b, group_sizes) (errors as there).
void check_grouped_mm(const Tensor& a, const Tensor& b, const Shape& group_sizes);

/// Makes `out`, the value of grouped_mm(a, b, group_sizes) computed elsewhere, the output of a
/// grouped_mm autograd node (when a or b needs a gradient), so that its backward is
/// grouped_mm's; returns it. The caller has run check_grouped_mm.
Tensor grouped_mm_with_grad(const Tensor& a, const Tensor& b, const Shape& group_sizes, Tensor out);

}  // namespace dtr
