#include "parallel/checkpoint/reshard.h"

#include <algorithm>

#include "dtensor/api.h"
#include "dtensor/spec.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

/// The part of `b` inside the global box [lo, hi).
Tensor view_of(const TensorBlock& b, const Shape& lo, const Shape& hi) {
  Tensor v = b.tensor;
  for (size_t d = 0; d < lo.size(); ++d) v = v.narrow(static_cast<int64_t>(d), lo[d] - b.offset[d], hi[d] - lo[d]);
  return v;
}

/// The overlap box of two blocks; false when they are disjoint.
bool overlap(const TensorBlock& a, const TensorBlock& b, Shape& lo, Shape& hi) {
  const size_t nd = a.tensor.sizes().size();
  lo.assign(nd, 0);
  hi.assign(nd, 0);
  for (size_t d = 0; d < nd; ++d) {
    lo[d] = std::max(a.offset[d], b.offset[d]);
    hi[d] = std::min(a.offset[d] + a.tensor.size(static_cast<int64_t>(d)),
                     b.offset[d] + b.tensor.size(static_cast<int64_t>(d)));
    if (hi[d] <= lo[d]) return false;
  }
  return true;
}

}  // namespace

bool blocks_overlap(const Shape& a_offset, const Shape& a_sizes, const Shape& b_offset, const Shape& b_sizes) {
  for (size_t d = 0; d < a_offset.size(); ++d)
    if (std::min(a_offset[d] + a_sizes[d], b_offset[d] + b_sizes[d]) <= std::max(a_offset[d], b_offset[d])) return false;
  return true;
}

TensorBlock local_block(const Tensor& t, Shape* global_shape) {
  TensorBlock b;
  if (t.is_distributed()) {
    const DTensorSpec& s = dtensor_spec(t, "checkpoint");
    for (size_t i = 0; i < s.placements.size(); ++i)
      DTR_CHECK(!s.placements[i].is_strided_shard() || !strided_partners(s.placements, s.mesh.shape(), i).empty(),
                "checkpoint: placements ", placements_str(s.placements), " of shape ", s.shape,
                ": a StridedShard without its partner dims holds several ranges, not one block; redistribute first");
    b.tensor = local_tensor(t);
    b.offset = s.local_offset();
    DTR_CHECK(b.tensor.sizes() == s.local_shape(), "checkpoint: local shard of shape ", b.tensor.sizes(),
              " differs from the spec's local shape ", s.local_shape());
    if (global_shape) *global_shape = s.shape;
  } else {
    b.tensor = t;
    b.offset = Shape(t.dim(), 0);
    if (global_shape) *global_shape = t.sizes();
  }
  return b;
}

int64_t copy_overlap(const TensorBlock& src, const TensorBlock& dst) {
  DTR_CHECK(src.tensor.dim() == dst.tensor.dim() && src.offset.size() == dst.offset.size() &&
                dst.offset.size() == static_cast<size_t>(dst.tensor.dim()),
            "copy_overlap: blocks of rank ", src.tensor.dim(), " and ", dst.tensor.dim(), " (offsets ", src.offset,
            ", ", dst.offset, ")");
  DTR_CHECK(src.tensor.dtype() == dst.tensor.dtype(), "copy_overlap: dtypes differ (", dtype_name(src.tensor.dtype()),
            " vs ", dtype_name(dst.tensor.dtype()), ")");
  Shape lo, hi;
  if (!overlap(src, dst, lo, hi)) return 0;
  NoGradGuard no_grad;
  Tensor d = view_of(dst, lo, hi);
  d.copy_(view_of(src, lo, hi));
  return d.numel();
}

void assemble_block(const std::vector<TensorBlock>& saved, const TensorBlock& dst, const std::string& what) {
  NoGradGuard no_grad;
  // Coverage as a bool tensor of the block's shape: each saved block sets its overlap, so an
  // element covered by several replicated copies counts once. Counted in f64 (exact), only
  // for the message: a float count rounds blocks of more than 2^24 elements.
  TensorBlock covered{zeros(dst.tensor.sizes(), TensorOptions(DType::bool_).with_device(dst.tensor.device())),
                      dst.offset};
  for (const auto& s : saved) {
    Shape lo, hi;
    if (copy_overlap(s, dst) == 0) continue;
    overlap(s, dst, lo, hi);
    view_of(covered, lo, hi).fill_(1.0);
  }
  if (all(covered.tensor).item<bool>()) return;
  const auto filled = static_cast<int64_t>(sum(to_dtype(covered.tensor, DType::f64)).item<double>());
  DTR_ERROR(what, " cover ", filled, " of ", dst.tensor.numel(), " elements of this rank's block (offset ", dst.offset,
            ", shape ", dst.tensor.sizes(), ")");
}

}  // namespace dtr
