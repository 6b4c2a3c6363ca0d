#pragma once
// The DTensor API: distribute_tensor, from_local, to_local, full_tensor, and accessors.
// Semantics follow PyTorch torch.distributed.tensor (DTensor.from_local / to_local /
// full_tensor / distribute_tensor).
#include <optional>

#include "dtensor/placement.h"
#include "dtensor/redistribute.h"
#include "dtensor/spec.h"

namespace dtr {

/// Splits a full tensor over `mesh` by `placements`. With src_data_rank = r (default 0) the
/// data of mesh rank r is broadcast first, so other ranks' values do not matter; with
/// std::nullopt every rank slices its own copy locally (no communication).
/// Errors: placements.size() != mesh.ndim(); shard dim out of range; Shard on a 0-d tensor.
Tensor distribute_tensor(const Tensor& t, const DeviceMesh& mesh, const Placements& placements,
                         std::optional<int> src_data_rank = 0);

/// Wraps this rank's shard `local` as a distributed tensor (differentiable). The global shape
/// is `shape` when given; otherwise it is inferred assuming even shards, or, with run_check,
/// exactly from every rank's local size (a collective that also checks ranks agree on the
/// other dims and the dtype).
/// Errors: placements.size() != mesh.ndim(); local shape inconsistent with `shape`.
Tensor from_local(const Tensor& local, const DeviceMesh& mesh, const Placements& placements, bool run_check = false,
                  std::optional<Shape> shape = std::nullopt);

/// This rank's shard as a plain tensor (differentiable: the gradient comes back with x's
/// placements).
Tensor to_local(const Tensor& x);

/// The whole tensor on every rank (redistribute to Replicate, then to_local). Differentiable.
Tensor full_tensor(const Tensor& x);

/// Lets the gradient accumulated into distributed leaf `leaf` stay Partial on the mesh dims
/// where the leaf is Replicate. By default a Partial gradient is reduced to the leaf's placements
/// when it arrives, in the gradient's dtype; a caller that reduces it itself, e.g. in another
/// dtype (FSDP + TP reduces in MixedPrecisionPolicy.reduce_dtype), sets this on the leaf and
/// redistributes its .grad when it needs it. Errors: `leaf` is not distributed.
void set_grad_keeps_partial(const Tensor& leaf, bool keep = true);

/// Accessors for a distributed tensor.
const Placements& placements(const Tensor& x);
const DeviceMesh& device_mesh(const Tensor& x);

}  // namespace dtr
