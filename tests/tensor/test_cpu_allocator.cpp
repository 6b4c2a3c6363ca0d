// The CPU allocator's large-block cache: reuse by rounded size, alignment, live-byte counters
// unchanged by caching, the limit (incl. 0 = off) and empty_cache, data of a reused block
// fully writable, small blocks untouched.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>

#include "tensor/cpu_allocator.h"
#include "tensor/ops.h"

using namespace dtr;

namespace {
struct LimitGuard {
  int64_t prev = cpu_cache_limit();
  ~LimitGuard() { set_cpu_cache_limit(prev); }
};
constexpr size_t kMiB = size_t{1} << 20;
}  // namespace

TEST_CASE("a freed large block is reused by the next request of its rounded size", "[cpu_allocator]") {
  LimitGuard lg;
  set_cpu_cache_limit(int64_t{1} << 30);
  cpu_empty_cache();
  Allocator* a = cpu_allocator();
  REQUIRE(a == get_allocator(Device::cpu()));
  const MemoryStats s0 = a->stats();

  void* p = a->allocate(3 * kMiB + 5);
  REQUIRE(reinterpret_cast<uintptr_t>(p) % 4096 == 0);  // page aligned
  std::memset(p, 0x5a, 3 * kMiB + 5);                          // every byte writable
  CHECK(a->stats().current - s0.current == static_cast<int64_t>(3 * kMiB + 5));
  a->deallocate(p, 3 * kMiB + 5);
  CHECK(a->stats().current == s0.current);  // live bytes: the cache does not count
  CpuCacheStats c = cpu_cache_stats();
  CHECK(c.cached_bytes == static_cast<int64_t>(4 * kMiB));  // rounded up to 2 MiB
  CHECK(c.cached_blocks == 1);

  const int64_t hits = c.hits;
  void* q = a->allocate(4 * kMiB);  // same rounded size: served from the cache
  CHECK(q == p);
  CHECK(cpu_cache_stats().hits == hits + 1);
  CHECK(cpu_cache_stats().cached_bytes == 0);
  const int64_t misses = cpu_cache_stats().misses;
  void* r = a->allocate(3 * kMiB);  // same rounded size, cache now empty: a fresh mapping
  CHECK(cpu_cache_stats().misses == misses + 1);
  a->deallocate(q, 4 * kMiB);
  a->deallocate(r, 3 * kMiB);
  CHECK(cpu_cache_stats().cached_blocks == 2);
  cpu_empty_cache();
  CHECK(cpu_cache_stats().cached_bytes == 0);
  CHECK(cpu_cache_stats().cached_blocks == 0);
}

TEST_CASE("the cache never holds more than its limit; limit 0 turns caching off", "[cpu_allocator]") {
  LimitGuard lg;
  cpu_empty_cache();
  Allocator* a = cpu_allocator();
  set_cpu_cache_limit(int64_t{10} * kMiB);
  void* b8 = a->allocate(8 * kMiB);
  void* b4 = a->allocate(4 * kMiB);
  void* b16 = a->allocate(16 * kMiB);
  a->deallocate(b8, 8 * kMiB);
  CHECK(cpu_cache_stats().cached_bytes == int64_t{8} * kMiB);
  a->deallocate(b4, 4 * kMiB);  // 12 MiB > 10: the largest cached block (8 MiB) goes first
  CHECK(cpu_cache_stats().cached_bytes == int64_t{4} * kMiB);
  a->deallocate(b16, 16 * kMiB);  // larger than the limit on its own: unmapped at once
  CHECK(cpu_cache_stats().cached_bytes == int64_t{4} * kMiB);
  set_cpu_cache_limit(0);  // lowering the limit releases what is above it
  CHECK(cpu_cache_stats().cached_bytes == 0);
  void* p = a->allocate(2 * kMiB);
  a->deallocate(p, 2 * kMiB);
  CHECK(cpu_cache_stats().cached_bytes == 0);
}

TEST_CASE("small blocks are 64-byte aligned and not cached; tensors round-trip through reused blocks",
          "[cpu_allocator]") {
  LimitGuard lg;
  set_cpu_cache_limit(int64_t{1} << 30);
  cpu_empty_cache();
  Allocator* a = cpu_allocator();
  void* s = a->allocate(1000);
  CHECK(reinterpret_cast<uintptr_t>(s) % 64 == 0);
  a->deallocate(s, 1000);
  CHECK(cpu_cache_stats().cached_bytes == 0);

  // A reused block holds the previous tensor's bytes; factories must still fill it.
  { Tensor t = full({1024, 1024}, 7.0, TensorOptions(DType::f32)); }
  CHECK(cpu_cache_stats().cached_blocks == 1);
  Tensor z = zeros({1024, 1024}, TensorOptions(DType::f32));
  CHECK(cpu_cache_stats().cached_blocks == 0);
  CHECK(sum(z).item<double>() == 0.0);
}
