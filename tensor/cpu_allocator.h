#pragma once
// The CPU allocator: 64-byte aligned blocks; large blocks are mmap'd and kept in a cache after
// free, so that a training loop, which allocates the same large activations and gradients
// every step, stops paying the kernel for fresh pages.
//
// Why: glibc serves every block above its mmap threshold (at most 32 MiB) with a fresh mmap,
// and every 4 KiB page of it costs a page fault and a kernel zero-fill on first touch. The
// 8-layer SmolLM2 LoRA step (dtr-bench train-step) took ~150k page faults (~600 MB of fresh
// pages, ~0.3 s of kernel time) per step, mostly in the 201 MB logits and their gradient.
// Source of the idea: PyTorch's CUDA caching allocator (blocks reused by rounded size, an
// explicit empty_cache()), applied to host memory.
//
// Policy:
//   * blocks below kCpuCacheMinBytes (1 MiB): std::aligned_alloc / free, not cached;
//   * larger blocks: size rounded up to a multiple of 2 MiB, mmap'd (page-aligned); on free
//     the block goes to a cache keyed by its rounded size and the next request of that
//     rounded size reuses it (no page faults, no zero-fill);
//   * the cache holds at most cpu_cache_limit() bytes (default 2 GiB, env DTR_CPU_CACHE_MB,
//     0 disables caching): a free that would exceed it first unmaps cached blocks, largest
//     first (simple; a step whose working set exceeds the cap loses its largest reuse first),
//     and unmaps the freed block itself when it alone does not fit.
// memory_stats() keeps counting live (requested) bytes only; cached bytes are reported by
// cpu_cache_stats() and are part of the process's resident memory.
// DTR_CPU_ALLOC_POISON=1 fills every allocation with 0xFF bytes (debugging: a reused block holds
// the previous tensor's bytes, so a kernel must write every element of its output).
#include <cstddef>
#include <cstdint>

#include "tensor/allocator.h"

namespace dtr {

/// Blocks of at least this many bytes are mmap'd and cached after free.
inline constexpr size_t kCpuCacheMinBytes = size_t{1} << 20;

/// Counters of the CPU block cache.
struct CpuCacheStats {
  int64_t cached_bytes = 0;   ///< bytes held in the cache (freed, not returned to the OS)
  int64_t cached_blocks = 0;  ///< blocks held in the cache
  int64_t hits = 0;           ///< large allocations served from the cache
  int64_t misses = 0;         ///< large allocations that mapped fresh memory
};

/// The process-wide CPU allocator (get_allocator(Device::cpu()) returns it).
Allocator* cpu_allocator();

/// Cache counters since process start (hits / misses) and now (cached bytes / blocks).
CpuCacheStats cpu_cache_stats();

/// Returns every cached block to the OS. Live blocks are not affected.
void cpu_empty_cache();

/// Sets the most bytes the cache may hold (0: no caching; cached blocks above the new limit
/// are released now); the environment is not read after this. Default: 2 GiB, or
/// DTR_CPU_CACHE_MB mebibytes (an integer in [0, 2^30]) read at the first large allocation or
/// cpu_cache_limit() call; a malformed value throws dtr::Error naming the variable.
void set_cpu_cache_limit(int64_t bytes);
int64_t cpu_cache_limit();

}  // namespace dtr
