#include "tensor/storage.h"

#include "tensor/error.h"

namespace dtr {

StorageImpl::StorageImpl(size_t nbytes, Device device)
    : nbytes_(nbytes), device_(device), allocator_(get_allocator(device)) {
  data_ = allocator_->allocate_on(device_, nbytes);
}

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

void StorageImpl::resize_(size_t nbytes) {
  DTR_CHECK(allocator_ != nullptr, "Storage::resize_: cannot resize external memory (", nbytes_, " bytes)");
  if (nbytes == nbytes_) return;
  allocator_->deallocate(data_, nbytes_);
  data_ = nullptr;
  nbytes_ = 0;
  data_ = allocator_->allocate_on(device_, nbytes);
  nbytes_ = nbytes;
}

StorageImpl::~StorageImpl() {
  if (allocator_) {
    allocator_->deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace dtr
