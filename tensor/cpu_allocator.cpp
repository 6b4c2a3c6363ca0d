#include "tensor/cpu_allocator.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/error.h"
#include "tensor/env_vars.h"

namespace dtr {
namespace {

constexpr size_t kLargeGranule = size_t{2} << 20;  // large sizes are rounded up to this
constexpr int64_t kDefaultCacheLimit = int64_t{2} << 30;

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

/// Maps `bytes` (a multiple of 2 MiB) of zero-filled anonymous memory (page-aligned). No
/// MADV_HUGEPAGE: with THP defrag "madvise" (Debian's default) the kernel compacts memory
/// synchronously on the first touch; measured on the 4-layer train-step, 1 thread: 4.8 s of
/// system time per run with it, 0.7 s without.
void* map_large(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

/// DTR_CPU_CACHE_MB (MiB, 0 .. 2^30), or the default. Throws dtr::Error naming the variable.
int64_t limit_from_env() {
  return env::integer("DTR_CPU_CACHE_MB", kDefaultCacheLimit >> 20) << 20;  // range checked there
}

/// DTR_CPU_ALLOC_POISON=1: every allocation is filled with 0xFF bytes (NaN for floating types,
/// -1 for integers), so a kernel that reads an output it did not write shows up in the tests
/// (reused cache blocks hold the previous tensor's bytes; fresh mmap'd ones are zero).
bool poison_from_env() { return env::flag("DTR_CPU_ALLOC_POISON"); }

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* p = nullptr;
    if (nbytes < kCpuCacheMinBytes) {
      p = std::aligned_alloc(64, round_up(nbytes, 64));
      if (!p) {  // give the cached blocks back to the OS and try once more
        empty_cache();
        p = std::aligned_alloc(64, round_up(nbytes, 64));
      }
    } else {
      p = take_or_map(round_up(nbytes, kLargeGranule));
    }
    DTR_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes (cached ",
              cpu_cache_stats().cached_bytes, " bytes; DTR_CPU_CACHE_MB bounds the cache)");
    static const bool poison = poison_from_env();
    if (poison) std::memset(p, 0xFF, nbytes);
    note_alloc(nbytes);
    return p;
  }

  void deallocate(void* p, size_t nbytes) override {
    if (!p) return;
    note_free(nbytes);
    if (nbytes < kCpuCacheMinBytes) {
      std::free(p);
      return;
    }
    give_back(p, round_up(nbytes, kLargeGranule));
  }

  Device device() const override { return Device::cpu(); }

  CpuCacheStats cache_stats() {
    std::lock_guard<std::mutex> g(mu_);
    return {cached_, static_cast<int64_t>(count_blocks()), hits_, misses_};
  }

  void empty_cache() {
    std::lock_guard<std::mutex> g(mu_);
    release_until(0);
  }

  void set_limit(int64_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    limit_ = bytes < 0 ? 0 : bytes;
    limit_read_ = true;
    release_until(limit_);
  }

  int64_t limit() {
    std::lock_guard<std::mutex> g(mu_);
    read_limit();
    return limit_;
  }

 private:
  void read_limit() {
    if (!limit_read_) {
      limit_ = limit_from_env();  // throws on a bad value, every time until it is fixed
      limit_read_ = true;
    }
  }

  void* take_or_map(size_t bytes) {
    {
      std::lock_guard<std::mutex> g(mu_);
      read_limit();
      auto it = cache_.find(bytes);
      if (it != cache_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= static_cast<int64_t>(bytes);
        ++hits_;
        return p;
      }
      ++misses_;
    }
    void* p = map_large(bytes);
    if (!p) {  // out of address space or memory: drop the cache and try once more
      empty_cache();
      p = map_large(bytes);
    }
    return p;
  }

  void give_back(void* p, size_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    read_limit();
    const auto b = static_cast<int64_t>(bytes);
    if (b > limit_) {
      munmap(p, bytes);
      return;
    }
    release_until(limit_ - b);
    try {
      cache_[bytes].push_back(p);
    } catch (...) {  // no memory for the bookkeeping: called from destructors, so never throw
      munmap(p, bytes);
      return;
    }
    cached_ += b;
  }

  /// Unmaps cached blocks, largest first, until at most `target` bytes stay cached.
  void release_until(int64_t target) {
    for (auto it = cache_.rbegin(); it != cache_.rend() && cached_ > target; ++it) {
      auto& blocks = it->second;
      while (!blocks.empty() && cached_ > target) {
        munmap(blocks.back(), it->first);
        blocks.pop_back();
        cached_ -= static_cast<int64_t>(it->first);
      }
    }
  }

  size_t count_blocks() const {
    size_t n = 0;
    for (const auto& [sz, v] : cache_) n += v.size();
    return n;
  }

  std::mutex mu_;
  std::map<size_t, std::vector<void*>> cache_;  // rounded size -> free blocks
  int64_t cached_ = 0, hits_ = 0, misses_ = 0, limit_ = kDefaultCacheLimit;
  bool limit_read_ = false;
};

CpuAllocator& instance() {
  static CpuAllocator* a = new CpuAllocator();  // never destroyed: storages may outlive statics
  return *a;
}

}  // namespace

Allocator* cpu_allocator() { return &instance(); }
CpuCacheStats cpu_cache_stats() { return instance().cache_stats(); }
void cpu_empty_cache() { instance().empty_cache(); }
void set_cpu_cache_limit(int64_t bytes) { instance().set_limit(bytes); }
int64_t cpu_cache_limit() { return instance().limit(); }

}  // namespace dtr
