#pragma once
// replicate: data parallelism with bucketed gradient all-reduce overlapping backward.
// Source: torch.nn.parallel.DistributedDataParallel (Reducer: buckets in reverse parameter
// order, 25 MB cap, launched in bucket order as they fill, averaged).
#include <cstdint>

#include "runtime/device_mesh.h"
#include "tensor/nn/module.h"

namespace dtr {

struct DDPOptions {
  /// Bucket capacity in bytes (PyTorch's bucket_cap_mb = 25).
  int64_t bucket_cap_bytes = 25LL * 1024 * 1024;
  /// Broadcast parameters and buffers from rank 0 at construction (like DDP).
  bool broadcast_from_rank0 = true;
};

/// Makes `module` data parallel over the 1-d `mesh`: parameters stay plain (replicated)
/// tensors; trainable parameters are grouped into buckets (reverse registration order, one
/// dtype per bucket, at most bucket_cap_bytes unless a single parameter is larger). When all
/// gradients of a bucket were accumulated (post-accumulate-grad hooks) the bucket is flattened
/// and all_reduced asynchronously (buckets launch in index order, so every rank issues the same
/// sequence). The last bucket's launch waits for all of them, averages (divide by the mesh
/// size) and writes the gradients back. The first hook of a synced backward (a gradient-ready
/// hook or the gradient of the module's output) queues DDP's finalize callback on the autograd
/// engine (queue_callback): at the end of the outermost backward it launches the buckets left
/// (zeros stand in for parameters that got no gradient) and waits, so after loss.backward() the
/// .grad are final and the user calls nothing (as torch DDP). The state lives on the module
/// (nn::Module::state, key "replicate").
/// Errors: mesh not 1-d; called twice on a module; fully_shard already applied to it; a DTensor
/// parameter; at a later forward, a
/// parameter whose requires_grad changed since replicate (the buckets are fixed; fully_shard
/// honours such a change instead).
void replicate(nn::Module& module, const DeviceMesh& mesh, const DDPOptions& options = {});

/// Gradient accumulation: with false, backward keeps the local gradients (no all-reduce).
void replicate_set_requires_gradient_sync(nn::Module& module, bool requires_sync);

/// True when `t` is a parameter of a module that replicate was applied to (fully_shard refuses
/// it: a descendant of a replicated module would be reduced twice).
bool is_replicated_parameter(const Tensor& t);

/// Number of buckets (tests).
int replicate_num_buckets(const nn::Module& module);

}  // namespace dtr
