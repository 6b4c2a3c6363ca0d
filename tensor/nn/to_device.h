#pragma once
// module_to_device: PyTorch's Module.to(device) for dtr modules.
#include "tensor/nn/module.h"

namespace dtr::nn {

/// Moves every parameter and buffer of `m` and its submodules to `device` (one copy each;
/// tensors already there are kept). requires_grad and names are kept, and a tensor registered
/// under several names (tied embeddings) stays one tensor. Call it on a plain model, before
/// parallelize_model / fully_shard (which then allocate their buffers on the mesh's device).
/// Errors: a distributed parameter (move the model before parallelizing it).
/// Source: torch.nn.Module.to(device).
void module_to_device(Module& m, Device device);

}  // namespace dtr::nn
