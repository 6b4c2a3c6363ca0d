#pragma once
// DTensorSpec (mesh, placements, global shape and strides, dtype) and the state a distributed
// tensor's TensorImpl carries: its spec and its local shard.
#include <memory>
#include <string>

#include "dtensor/placement.h"
#include "runtime/device_mesh.h"
#include "tensor/tensor.h"

namespace dtr {

/// Metadata of a distributed tensor: where it lives and how it is split.
struct DTensorSpec {
  DeviceMesh mesh;
  Placements placements;  // one per mesh dim, shard dims normalised
  Shape shape;            // global shape
  DType dtype = DType::f32;

  Shape strides() const { return contiguous_strides(shape); }
  /// This rank's local shape and global offset.
  Shape local_shape() const;
  Shape local_offset() const;
  /// True when no mesh dim is Partial.
  bool has_partial() const;
  /// Number of shards of tensor dim d (product of mesh sizes that shard it).
  int64_t num_shards(int64_t d) const;
  bool operator==(const DTensorSpec& o) const;
  std::string str() const;
};

/// What a distributed tensor's impl holds (TensorImpl::dist).
struct DTensorState final : DistributedSpec {
  DTensorState(DTensorSpec s, Tensor l) : spec(std::move(s)), local(std::move(l)) {}
  DTensorSpec spec;
  Tensor local;
  /// Leaves only: the accumulated gradient keeps Partial placements on mesh dims where the leaf
  /// is Replicate (set_grad_keeps_partial in api.h).
  bool grad_keeps_partial = false;
  std::string str() const override { return spec.str(); }
};

/// Wraps a local shard as a distributed tensor with `spec` (no communication, no autograd).
/// Errors: local shape differs from the spec's local shape for this rank (checked unless
/// `check` is false: the dispatcher's hot path, whose rules compute the local shape).
Tensor make_dtensor(const Tensor& local, const DTensorSpec& spec, bool check = true);
/// The spec of a distributed tensor; throws naming `op` for a plain tensor.
const DTensorSpec& dtensor_spec(const Tensor& t, const char* op = "dtensor_spec");
/// The local shard of a distributed tensor (no autograd); throws for a plain tensor.
const Tensor& local_tensor(const Tensor& t);

}  // namespace dtr
