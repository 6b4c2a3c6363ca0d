#include "tensor/allocator.h"

#include <cstdlib>

#include "tensor/error.h"

namespace dtr {

MemoryStats Allocator::stats() const {
  return {current_.load(), peak_.load(), allocations_.load()};
}

void Allocator::reset_peak() { peak_.store(current_.load()); }

void Allocator::note_alloc(size_t nbytes) {
  const int64_t now = current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t p = peak_.load();
  while (now > p && !peak_.compare_exchange_weak(p, now)) {
  }
  allocations_.fetch_add(1);
}

void Allocator::note_free(size_t nbytes) { current_.fetch_sub(static_cast<int64_t>(nbytes)); }

namespace {

/// CPU allocator: 64-byte aligned blocks (one cache line, full AVX-512 vectors).
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    DTR_CHECK(p != nullptr, "cpu allocator: out of memory allocating ", nbytes, " bytes");
    note_alloc(nbytes);
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    if (!p) return;
    std::free(p);
    note_free(nbytes);
  }
  Device device() const override { return Device::cpu(); }
};

Allocator* g_allocators[kNumDeviceTypes] = {nullptr, nullptr};

}  // namespace

Allocator* get_allocator(Device d) {
  static CpuAllocator cpu;
  if (d.is_cpu()) return &cpu;
  Allocator* a = g_allocators[static_cast<int>(d.type)];
  DTR_CHECK(a != nullptr, "no allocator for device ", d, " (was dtr built with -DDTR_CUDA=ON?)");
  return a;
}

void set_allocator(DeviceType t, Allocator* a) { g_allocators[static_cast<int>(t)] = a; }

MemoryStats memory_stats(Device d) { return get_allocator(d)->stats(); }
void reset_peak_memory(Device d) { get_allocator(d)->reset_peak(); }

}  // namespace dtr
