#pragma once
// UnsafePreserveVersionCounter: writes into a tensor that autograd must not see as in-place
// modifications (see the class comment).
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace dtr {

/// Restores the version counters of `tensors` (and of every view sharing them) when it goes out
/// of scope, so in-place writes made meanwhile are invisible to autograd's saved-tensor check.
/// Only for writes that refill a buffer with the values autograd saw (FSDP's all-gather
/// copy-out into an unsharded parameter freed after forward and refilled before backward).
/// Source: PyTorch torch.autograd._unsafe_preserve_version_counter.
class UnsafePreserveVersionCounter {
 public:
  explicit UnsafePreserveVersionCounter(std::vector<Tensor> tensors);
  ~UnsafePreserveVersionCounter();
  UnsafePreserveVersionCounter(const UnsafePreserveVersionCounter&) = delete;
  UnsafePreserveVersionCounter& operator=(const UnsafePreserveVersionCounter&) = delete;

 private:
  std::vector<Tensor> tensors_;
  std::vector<uint32_t> versions_;
};

}  // namespace dtr
