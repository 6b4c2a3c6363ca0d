#pragma once
// The tensor an optimizer updates: the local storage of a parameter. For a plain tensor that
// is the tensor itself; for a distributed tensor the dtensor layer registers a converter (its
// to_local) through set_optim_local_converter, so that tensor/ knows nothing of meshes.
#include <functional>

#include "tensor/tensor.h"

namespace dtr::optim {

/// Maps a distributed tensor to its local shard (sharing storage, no copy).
using LocalConverter = std::function<Tensor(const Tensor&)>;

/// The tensor itself when not distributed; else the registered converter's result.
/// Errors: a distributed tensor while no converter is registered.
Tensor optim_local(const Tensor& t);

/// Registers (or clears, with an empty function) the converter for distributed tensors.
void set_optim_local_converter(LocalConverter fn);

}  // namespace dtr::optim
