#pragma once
// Allocator interface with current / peak byte counters per device, and the CPU allocator.
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "tensor/device.h"

namespace dtr {

/// Byte counters of one allocator. `current` = bytes held by live storages, `peak` = the
/// largest `current` since the last reset_peak(), `allocations` = number of allocate() calls.
struct MemoryStats {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocations = 0;
};

/// Allocates device memory for Storage. Implementations count bytes through note_alloc /
/// note_free so that peak memory per rank is a measured figure.
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns a block of at least `nbytes` bytes (nullptr for 0). Throws dtr::Error when out
  /// of memory, naming the size.
  virtual void* allocate(size_t nbytes) = 0;
  /// Allocates on device `d` (of this allocator's device type). Allocators serving several
  /// devices (CUDA:0, CUDA:1, ...) override it; the default ignores `d` and calls allocate().
  /// Storage allocates through this.
  virtual void* allocate_on(Device d, size_t nbytes) {
    (void)d;
    return allocate(nbytes);
  }
  virtual void deallocate(void* p, size_t nbytes) = 0;
  virtual Device device() const = 0;
  MemoryStats stats() const;
  void reset_peak();

 protected:
  void note_alloc(size_t nbytes);
  void note_free(size_t nbytes);

 private:
  std::atomic<int64_t> current_{0}, peak_{0}, allocations_{0};
};

/// The allocator for a device type. CPU: cpu_allocator() (64-byte aligned, large blocks cached).
/// CUDA: registered by the CUDA backend; throws dtr::Error when the build has no CUDA backend.
Allocator* get_allocator(Device d);
/// Installs the allocator of a device type (the CUDA backend calls this at load time).
void set_allocator(DeviceType t, Allocator* a);
/// Counters of the allocator of `d`.
MemoryStats memory_stats(Device d = Device::cpu());
void reset_peak_memory(Device d = Device::cpu());

}  // namespace dtr
