#pragma once
// The CUDA context of a process: error checking, device count, the current device and its
// compute stream. Only compiled when DTR_WITH_CUDA (the CUDA backend) is on.
// Every CUDA kernel of dtr runs on current_stream(); communication uses the streams of
// NcclProcessGroup and orders itself against this one with events.
#ifdef DTR_WITH_CUDA
#include <cuda_runtime.h>

#include "tensor/error.h"

/// Throws dtr::Error naming the failed CUDA call, file and line, and cudaGetErrorString.
#define DTR_CUDA_CHECK(expr)                                                                  \
  do {                                                                                        \
    cudaError_t dtr_cuda_err_ = (expr);                                                       \
    if (dtr_cuda_err_ != cudaSuccess)                                                         \
      throw ::dtr::Error(::dtr::detail::cat(#expr, " failed at ", __FILE__, ":", __LINE__, ": ", \
                                            cudaGetErrorString(dtr_cuda_err_)));              \
  } while (0)

namespace dtr::cuda {

/// Number of visible CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count();
/// True when at least one CUDA device can be used.
bool is_available();
/// Makes `index` the current device of this thread (cudaSetDevice). Throws when out of range.
void set_device(int index);
/// The current device of this thread.
int current_device();
/// The compute stream of the current device (created on first use, non-blocking). Kernels,
/// cuBLAS(Lt) calls and copies issued by dtr's ops all go to this stream.
cudaStream_t current_stream();
/// Replaces the compute stream of the current device (nullptr restores the default one).
void set_current_stream(cudaStream_t s);
/// Waits for all work on the current stream.
void synchronize();

/// Makes device `index` current for this thread for the guard's lifetime and restores the
/// previous device afterwards (no cudaSetDevice when it is already current).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
