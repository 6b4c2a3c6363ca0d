#include "tensor/allocator.h"

#include "tensor/cpu_allocator.h"
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

Allocator* g_allocators[kNumDeviceTypes] = {nullptr, nullptr};

}  // namespace

Allocator* get_allocator(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  Allocator* a = g_allocators[static_cast<int>(d.type)];
  DTR_CHECK(a != nullptr, "no allocator for device ", d, " (was dtr built with -DDTR_CUDA=ON?)");
  return a;
}

void set_allocator(DeviceType t, Allocator* a) { g_allocators[static_cast<int>(t)] = a; }

MemoryStats memory_stats(Device d) { return get_allocator(d)->stats(); }
void reset_peak_memory(Device d) { get_allocator(d)->reset_peak(); }

}  // namespace dtr
