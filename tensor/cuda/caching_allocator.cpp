// The CUDA caching allocator (see caching_allocator.h).
#include "tensor/cuda/caching_allocator.h"

#ifdef DTR_WITH_CUDA
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/cuda_context.h"

namespace dtr::cuda {

size_t round_size(size_t nbytes) {
  if (nbytes <= kSmallRequest) return (nbytes + kSmallRound - 1) / kSmallRound * kSmallRound;
  return (nbytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

namespace {

/// Prints a CUDA error that cannot be thrown (deallocation runs in destructors).
bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "dtr cuda caching allocator: %s failed: %s\n", what, cudaGetErrorString(e));
  (void)cudaGetLastError();
  return false;
}

std::string mib(int64_t bytes) { return detail::cat(static_cast<double>(bytes) / (1 << 20), " MiB"); }

struct Block {
  void* ptr = nullptr;
  size_t size = 0;       // size class (bytes obtained from cudaMalloc)
  size_t requested = 0;  // bytes asked for by the live owner
  int device = 0;
  cudaStream_t stream = nullptr;             // stream it was allocated on
  std::vector<cudaStream_t> other_streams;   // record_stream()
};

/// A freed block waiting for the work of its recorded streams.
struct Pending {
  Block* block;
  std::vector<cudaEvent_t> events;
};

class CachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    check_devices(nbytes, 0);
    return allocate_on(Device::cuda(current_device()), nbytes);
  }

  void* allocate_on(Device d, size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    check_devices(nbytes, d.index);
    DeviceGuard guard(d.index);
    cudaStream_t stream = current_stream();
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    process_pending();
    Block* b = take_cached(d.index, stream, size);
    if (b) {
      ++stats_.num_cache_hits;
      stats_.cached -= static_cast<int64_t>(b->size);
    } else {
      void* p = device_malloc(d.index, size, nbytes);  // throws on OOM: allocate the Block after
      b = new Block;
      b->ptr = p;
      b->size = size;
      b->device = d.index;
      b->stream = stream;
    }
    b->requested = nbytes;
    b->other_streams.clear();
    live_[b->ptr] = b;
    stats_.allocated += static_cast<int64_t>(b->size);
    note_alloc(nbytes);
    return b->ptr;
  }

  void deallocate(void* p, size_t nbytes) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      std::fprintf(stderr, "dtr cuda caching allocator: deallocate of unknown pointer %p (%zu bytes)\n", p, nbytes);
      return;
    }
    Block* b = it->second;
    live_.erase(it);
    stats_.allocated -= static_cast<int64_t>(b->size);
    stats_.cached += static_cast<int64_t>(b->size);
    note_free(b->requested);
    if (b->other_streams.empty()) {
      free_[key(b->device, b->stream, b->size)].push_back(b);
      return;
    }
    // Used on other streams: reuse only after their work queued so far has completed.
    Pending pend{b, {}};
    int prev = -1;
    bool all_ok = ok(cudaGetDevice(&prev), "cudaGetDevice") && ok(cudaSetDevice(b->device), "cudaSetDevice");
    for (cudaStream_t s : b->other_streams) {
      if (!all_ok) break;
      cudaEvent_t ev;
      all_ok = ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
      if (!all_ok) break;
      pend.events.push_back(ev);
      all_ok = ok(cudaEventRecord(ev, s), "cudaEventRecord");
    }
    if (prev >= 0) (void)cudaSetDevice(prev);
    if (!all_ok) {  // cannot track the streams (CUDA shutting down?): never reuse the block
      for (cudaEvent_t ev : pend.events) (void)cudaEventDestroy(ev);
      stats_.cached -= static_cast<int64_t>(b->size);
      delete b;
      return;
    }
    pending_.push_back(std::move(pend));
  }

  Device device() const override { return Device::cuda(0); }

  void record_stream(void* p, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    DTR_CHECK(it != live_.end(), "cuda::record_stream: ", p, " is not the start of a live CUDA block");
    Block* b = it->second;
    if (s == b->stream) return;
    for (cudaStream_t o : b->other_streams)
      if (o == s) return;
    b->other_streams.push_back(s);
  }

  bool owns(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(p) != 0;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    process_pending();
    release_cached(-1);
  }

  CachingAllocatorStats stats_snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  using Key = std::tuple<int, uintptr_t, size_t>;  // device, stream, size class
  static Key key(int dev, cudaStream_t s, size_t size) { return {dev, reinterpret_cast<uintptr_t>(s), size}; }

  static void check_devices(size_t nbytes, int index) {
    const int n = device_count();
    DTR_CHECK(n > 0, "no CUDA device: cannot allocate ", nbytes, " bytes on cuda:", index,
              " (dtr was built with CUDA but this process sees no CUDA device; check CUDA_VISIBLE_DEVICES and the "
              "driver)");
    DTR_CHECK(index >= 0 && index < n, "cuda allocator: device cuda:", index, " out of range (", n,
              " CUDA devices visible)");
  }

  /// A cached block of (device, stream) for `size`: the exact size class in the small pool; in
  /// the large pool the smallest block of at most 1.25 x size (bounded waste).
  Block* take_cached(int dev, cudaStream_t s, size_t size) {
    auto it = free_.lower_bound(key(dev, s, size));
    while (it != free_.end() && it->second.empty()) it = free_.erase(it);
    if (it == free_.end()) return nullptr;
    const auto& [kd, ks, ksize] = it->first;
    if (kd != dev || ks != reinterpret_cast<uintptr_t>(s)) return nullptr;
    const bool fits = size <= kSmallRequest ? ksize == size : ksize <= size + size / 4;
    if (!fits) return nullptr;
    Block* b = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    return b;
  }

  /// cudaMalloc on the current device (= dev); on OOM empties this device's cache and retries.
  void* device_malloc(int dev, size_t size, size_t requested) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached(dev);
      e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      DTR_ERROR("CUDA out of memory: tried to allocate ", requested, " bytes (", mib(static_cast<int64_t>(size)),
                " size class) on cuda:", dev, "; dtr holds ", mib(stats_.allocated), " allocated by tensors, ",
                mib(stats_.cached), " cached, ", mib(stats_.reserved), " reserved in total; the device has ",
                mib(static_cast<int64_t>(free_b)), " free of ", mib(static_cast<int64_t>(total_b)));
    }
    DTR_CHECK(e == cudaSuccess, "cudaMalloc(", size, " bytes) on cuda:", dev, " failed: ", cudaGetErrorString(e));
    stats_.reserved += static_cast<int64_t>(size);
    ++stats_.num_device_allocs;
    return p;
  }

  /// Moves pending blocks whose recorded streams finished into the cache.
  void process_pending() {
    for (size_t i = 0; i < pending_.size();) {
      Pending& pd = pending_[i];
      bool done = true;
      for (cudaEvent_t ev : pd.events) {
        const cudaError_t e = cudaEventQuery(ev);
        if (e == cudaErrorNotReady) {
          (void)cudaGetLastError();
          done = false;
          break;
        }
        ok(e, "cudaEventQuery");  // an error here means the work failed: the block is free anyway
      }
      if (!done) {
        ++i;
        continue;
      }
      for (cudaEvent_t ev : pd.events) (void)cudaEventDestroy(ev);
      Block* b = pd.block;
      free_[key(b->device, b->stream, b->size)].push_back(b);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  /// cudaFree of every cached block of device `dev` (all devices when dev < 0).
  void release_cached(int dev) {
    int prev = -1;
    (void)cudaGetDevice(&prev);
    for (auto it = free_.begin(); it != free_.end();) {
      if (dev >= 0 && std::get<0>(it->first) != dev) {
        ++it;
        continue;
      }
      for (Block* b : it->second) {
        if (ok(cudaSetDevice(b->device), "cudaSetDevice") && ok(cudaFree(b->ptr), "cudaFree")) {
          stats_.reserved -= static_cast<int64_t>(b->size);
          ++stats_.num_device_frees;
        }
        stats_.cached -= static_cast<int64_t>(b->size);
        delete b;
      }
      it = free_.erase(it);
    }
    if (prev >= 0) (void)cudaSetDevice(prev);
  }

  std::mutex mu_;
  std::unordered_map<void*, Block*> live_;
  std::map<Key, std::vector<Block*>> free_;
  std::vector<Pending> pending_;
  CachingAllocatorStats stats_;
};

CachingAllocator* instance() {
  // Never destroyed: tensors freed during static destruction still find their allocator, and
  // no cudaFree runs after the CUDA runtime was torn down.
  static CachingAllocator* a = new CachingAllocator;
  return a;
}

// Installed at load time (the library is built with the CUDA backend).
const bool g_registered = (set_allocator(DeviceType::CUDA, instance()), true);

}  // namespace

Allocator* caching_allocator() { return instance(); }
CachingAllocatorStats caching_allocator_stats() { return instance()->stats_snapshot(); }
void empty_cache() { instance()->empty_cache(); }
void record_stream(void* ptr, cudaStream_t stream) { instance()->record_stream(ptr, stream); }
bool owns(void* ptr) { return instance()->owns(ptr); }

}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
