#pragma once
// Output allocation in an input's memory order (PyTorch's empty_like with torch.preserve_format),
// for CPU kernels that read strided views in place: sdpa and rotary_embedding write their outputs
// in the layout of the views they get (the projections' [B, T, H, D] seen as [B, H, T, D]), so the
// model's transposes back stay views and no layout copy is made.
#include <algorithm>
#include <numeric>

#include "tensor/ops.h"

namespace dtr::cpu {

/// An uninitialised CPU tensor of t's sizes in dtype `dt` whose dims lie in memory in t's order
/// (strides sorted descending; ties keep the dim order, so a unit-stride last dim stays last) when
/// t is dense and non-overlapping, i.e. a permutation of a contiguous tensor; else contiguous.
inline Tensor empty_preserve_layout(const Tensor& t, DType dt) {
  const TensorOptions opt(dt);
  const int64_t n = t.dim();
  if (n < 2 || t.is_contiguous()) return empty(t.sizes(), opt);
  Shape perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  if (!permute(t, perm).is_contiguous()) return empty(t.sizes(), opt);  // overlapping or with gaps
  Shape psizes(static_cast<size_t>(n)), inverse(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    psizes[i] = t.size(perm[i]);
    inverse[perm[i]] = i;
  }
  return permute(empty(psizes, opt), inverse);
}

}  // namespace dtr::cpu
