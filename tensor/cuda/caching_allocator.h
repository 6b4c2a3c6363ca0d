#pragma once
// The CUDA caching allocator: device memory for CUDA tensors without a cudaMalloc / cudaFree
// per tensor. Source: the design of PyTorch's CUDACachingAllocator, simplified (no block
// splitting):
//   - size classes: requests up to 1 MiB ("small pool") are rounded up to a multiple of 512 B,
//     larger ones ("large pool") to a multiple of 2 MiB;
//   - a freed block goes back to the cache of (device, stream it was allocated on) and serves
//     the next request of the same size class on that stream: work queued on one stream runs
//     in order, so the new owner's kernels run after the old owner's;
//   - record_stream(ptr, s): the block is also used on stream s; when freed it is reused only
//     after the work queued on s up to the free completed (an event per recorded stream);
//   - counters: MemoryStats (via note_alloc / note_free, requested bytes of live blocks) plus
//     reserved / cached bytes; empty_cache() returns cached blocks to CUDA;
//   - out of memory: the cache is emptied and cudaMalloc retried once; then dtr::Error names
//     the requested size, the bytes allocated by tensors, cached and reserved, and the free /
//     total memory of the device.
// Installed as the allocator of DeviceType::CUDA at load time in builds with the CUDA backend.
// When the process sees no CUDA device, allocation throws "no CUDA device".
#ifdef DTR_WITH_CUDA
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tensor/allocator.h"

namespace dtr::cuda {

/// Requests up to this size use the small pool (512 B granularity).
constexpr size_t kSmallRequest = size_t{1} << 20;
constexpr size_t kSmallRound = 512;
/// Larger requests are rounded to a multiple of 2 MiB.
constexpr size_t kLargeRound = size_t{2} << 20;

/// The size class of a request of `nbytes` (> 0).
size_t round_size(size_t nbytes);

/// Counters of the caching allocator over all devices.
struct CachingAllocatorStats {
  int64_t allocated = 0;  ///< rounded bytes of blocks held by tensors
  int64_t reserved = 0;   ///< bytes obtained from cudaMalloc and not yet returned
  int64_t cached = 0;     ///< reserved bytes in the cache (free, or waiting for a recorded stream)
  int64_t num_device_allocs = 0;  ///< cudaMalloc calls
  int64_t num_device_frees = 0;   ///< cudaFree calls
  int64_t num_cache_hits = 0;     ///< requests served from the cache
};

/// The process's CUDA caching allocator (also reachable as get_allocator(Device::cuda())).
Allocator* caching_allocator();
CachingAllocatorStats caching_allocator_stats();
/// Returns every cached block that no stream still uses to CUDA (cudaFree). Blocks held by
/// tensors are untouched.
void empty_cache();
/// Marks the block starting at `ptr` (a storage's data pointer from this allocator) as used on
/// `stream`: when freed, it is reused only after the work queued on `stream` so far has
/// completed. A pointer that is not the start of a live block is an error.
void record_stream(void* ptr, cudaStream_t stream);
/// True when `ptr` is the start of a live block of the caching allocator.
bool owns(void* ptr);

}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
