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
/// size) and writes the gradients back, so after loss.backward() the .grad are final.
/// Contract as fully_shard: when a trainable parameter received no gradient, call
/// replicate_finish_backward(module) before the optimizer step (zeros stand in).
/// Errors: mesh not 1-d; called twice on a module; a DTensor parameter; at a later forward, a
/// parameter whose requires_grad changed since replicate (the buckets are fixed; fully_shard
/// honours such a change instead).
void replicate(nn::Module& module, const DeviceMesh& mesh, const DDPOptions& options = {});

/// Gradient accumulation: with false, backward keeps the local gradients (no all-reduce).
void replicate_set_requires_gradient_sync(nn::Module& module, bool requires_sync);

/// Launches the buckets not launched yet (missing gradients = zeros), waits, averages.
/// Idempotent. Errors: replicate was not applied to `module`.
void replicate_finish_backward(nn::Module& module);

/// Number of buckets (tests).
int replicate_num_buckets(const nn::Module& module);

}  // namespace dtr
