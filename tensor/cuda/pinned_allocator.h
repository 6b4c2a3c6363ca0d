#pragma once
// Pinned (page-locked) host memory for host<->device transfers, MPI staging of CUDA tensors
// and CPU offload: copies from/to pinned memory are true DMA and can run asynchronously.
// Cached like PyTorch's CachingHostAllocator: blocks are rounded up to a power of two (at
// least 4 KiB) and reused; a block used by an asynchronous copy on a stream (pinned_record_stream)
// is reused only after that stream's work queued up to the free has completed.
#ifdef DTR_WITH_CUDA
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tensor/tensor.h"

namespace dtr::cuda {

/// A page-locked host block of at least `nbytes` bytes (nullptr for 0).
/// Errors: no CUDA device / driver ("no CUDA device"), cudaHostAlloc failure naming the size.
void* pinned_alloc(size_t nbytes);
/// Returns a block from pinned_alloc to the cache (no-op for nullptr; never throws).
void pinned_free(void* p);
/// The block starting at `p` is read/written by work queued on `stream`: pinned_free defers
/// its reuse until that work completed. No-op when `p` is not a live pinned block.
void pinned_record_stream(void* p, cudaStream_t stream);
/// True when `p` is the start of a live pinned block.
bool is_pinned(const void* p);
/// cudaFreeHost of every cached pinned block no stream still uses.
void empty_pinned_cache();
/// Bytes of pinned blocks held by tensors / cached.
struct PinnedStats {
  int64_t allocated = 0;
  int64_t cached = 0;
};
PinnedStats pinned_stats();

/// A contiguous CPU tensor of `shape` and `dtype` in pinned memory (uninitialised).
Tensor empty_pinned(const Shape& shape, DType dtype);

}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
