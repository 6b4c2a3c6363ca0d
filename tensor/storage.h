#pragma once
// Storage: a reference-counted block of device memory shared by a tensor and its views.
#include <cstddef>
#include <functional>
#include <memory>

#include "tensor/allocator.h"

namespace dtr {

/// A block of `nbytes` bytes on `device`. Freed through its allocator when the last tensor
/// (or view) holding it goes away. External memory (e.g. a memory-mapped file) is wrapped
/// with a custom deleter and not counted by any allocator.
class StorageImpl {
 public:
  StorageImpl(size_t nbytes, Device device);
  StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  /// Frees the block and allocates `nbytes` new bytes through the same allocator (contents
  /// NOT preserved; 0 frees). Tensors and views keep pointing at this storage, so a tensor
  /// saved by autograd sees the new block. FSDP frees unsharded parameters with resize_(0)
  /// and refills them before backward (torch untyped_storage().resize_).
  /// Errors: external memory (no allocator).
  void resize_(size_t nbytes);

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  std::function<void(void*)> deleter_;
};

using Storage = std::shared_ptr<StorageImpl>;

}  // namespace dtr
