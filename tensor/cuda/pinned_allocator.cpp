// Pinned host memory (see pinned_allocator.h).
#include "tensor/cuda/pinned_allocator.h"

#ifdef DTR_WITH_CUDA
#include <cstdio>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/cuda_context.h"

namespace dtr::cuda {
namespace {

struct HostBlock {
  void* ptr = nullptr;
  size_t size = 0;
  std::vector<std::pair<int, cudaStream_t>> streams;  // (device, stream) of recorded uses
};

struct Pending {
  HostBlock* block;
  std::vector<cudaEvent_t> events;
};

size_t host_round(size_t n) {
  size_t s = 4096;
  while (s < n) s <<= 1;
  return s;
}

class PinnedAllocator {
 public:
  void* alloc(size_t nbytes) {
    if (nbytes == 0) return nullptr;
    DTR_CHECK(device_count() > 0, "no CUDA device: cannot allocate ", nbytes,
              " bytes of pinned host memory (needs the CUDA driver and a device)");
    const size_t size = host_round(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    process_pending();
    HostBlock* b = nullptr;
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      b = it->second.back();
      it->second.pop_back();
      cached_ -= static_cast<int64_t>(size);
    } else {
      b = new HostBlock;
      b->size = size;
      const cudaError_t e = cudaHostAlloc(&b->ptr, size, cudaHostAllocDefault);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        delete b;
        DTR_ERROR("cudaHostAlloc(", size, " bytes) for ", nbytes, " bytes of pinned memory failed: ",
                  cudaGetErrorString(e), " (", allocated_, " bytes pinned by tensors, ", cached_, " cached)");
      }
    }
    b->streams.clear();
    live_[b->ptr] = b;
    allocated_ += static_cast<int64_t>(size);
    return b->ptr;
  }

  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      std::fprintf(stderr, "dtr pinned allocator: free of unknown pointer %p\n", p);
      return;
    }
    HostBlock* b = it->second;
    live_.erase(it);
    allocated_ -= static_cast<int64_t>(b->size);
    cached_ += static_cast<int64_t>(b->size);
    if (b->streams.empty()) {
      free_[b->size].push_back(b);
      return;
    }
    Pending pd{b, {}};
    int prev = -1;
    bool good = cudaGetDevice(&prev) == cudaSuccess;
    for (const auto& [dev, s] : b->streams) {
      cudaEvent_t ev;
      good = good && cudaSetDevice(dev) == cudaSuccess &&
             cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess;
      if (!good) break;
      pd.events.push_back(ev);
      good = cudaEventRecord(ev, s) == cudaSuccess;
    }
    if (prev >= 0) (void)cudaSetDevice(prev);
    if (!good) {  // cannot track the uses: keep the block out of the cache for good
      (void)cudaGetLastError();
      for (cudaEvent_t ev : pd.events) (void)cudaEventDestroy(ev);
      cached_ -= static_cast<int64_t>(b->size);
      delete b;
      return;
    }
    pending_.push_back(std::move(pd));
  }

  void record_stream(void* p, cudaStream_t s) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    for (const auto& u : it->second->streams)
      if (u.first == dev && u.second == s) return;
    it->second->streams.emplace_back(dev, s);
  }

  bool owns(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(const_cast<void*>(p)) != 0;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    process_pending();
    for (auto& [size, blocks] : free_) {
      for (HostBlock* b : blocks) {
        (void)cudaFreeHost(b->ptr);
        cached_ -= static_cast<int64_t>(b->size);
        delete b;
      }
    }
    free_.clear();
  }

  PinnedStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {allocated_, cached_};
  }

 private:
  void process_pending() {
    for (size_t i = 0; i < pending_.size();) {
      bool done = true;
      for (cudaEvent_t ev : pending_[i].events) {
        if (cudaEventQuery(ev) == cudaErrorNotReady) {
          done = false;
          break;
        }
      }
      (void)cudaGetLastError();
      if (!done) {
        ++i;
        continue;
      }
      for (cudaEvent_t ev : pending_[i].events) (void)cudaEventDestroy(ev);
      HostBlock* b = pending_[i].block;
      free_[b->size].push_back(b);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  std::mutex mu_;
  std::unordered_map<void*, HostBlock*> live_;
  std::map<size_t, std::vector<HostBlock*>> free_;
  std::vector<Pending> pending_;
  int64_t allocated_ = 0, cached_ = 0;
};

PinnedAllocator* instance() {
  static PinnedAllocator* a = new PinnedAllocator;  // never destroyed (see caching_allocator.cpp)
  return a;
}

}  // namespace

void* pinned_alloc(size_t nbytes) { return instance()->alloc(nbytes); }
void pinned_free(void* p) { instance()->free(p); }
void pinned_record_stream(void* p, cudaStream_t stream) { instance()->record_stream(p, stream); }
bool is_pinned(const void* p) { return p && instance()->owns(p); }
void empty_pinned_cache() { instance()->empty_cache(); }
PinnedStats pinned_stats() { return instance()->stats(); }

Tensor empty_pinned(const Shape& shape, DType dtype) {
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * itemsize(dtype);
  void* p = pinned_alloc(nbytes);
  return from_blob(p, shape, dtype, [](void* q) { pinned_free(q); });
}

}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
