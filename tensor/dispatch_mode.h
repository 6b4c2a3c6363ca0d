#pragma once
// DispatchMode: a per-thread hook that sees every top-level dispatched op call first (PyTorch's
// TorchDispatchMode). Selective activation checkpointing caches and replays op outputs with it.
#include <vector>

#include "tensor/dispatch.h"

namespace dtr {

/// While the mode's dispatch() runs, the mode is inactive, so calling dtr::dispatch(call) from
/// it runs the op normally (autograd recording happens above dispatch, in the public op).
class DispatchMode {
 public:
  virtual ~DispatchMode() = default;
  virtual std::vector<Tensor> dispatch(const OpCall& call) = 0;
};

/// Sets this thread's dispatch mode (nullptr: none) and returns the previous one.
DispatchMode* set_dispatch_mode(DispatchMode* mode);

/// Makes `mode` this thread's dispatch mode for the guard's lifetime.
class DispatchModeGuard {
 public:
  explicit DispatchModeGuard(DispatchMode* mode) : prev_(set_dispatch_mode(mode)) {}
  ~DispatchModeGuard() { set_dispatch_mode(prev_); }
  DispatchModeGuard(const DispatchModeGuard&) = delete;
  DispatchModeGuard& operator=(const DispatchModeGuard&) = delete;

 private:
  DispatchMode* prev_;
};

}  // namespace dtr
