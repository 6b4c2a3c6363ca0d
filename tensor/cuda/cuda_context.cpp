// The CUDA context of a process (see cuda_context.h).
#include "tensor/cuda/cuda_context.h"

#ifdef DTR_WITH_CUDA
#include <mutex>
#include <vector>

namespace dtr::cuda {
namespace {

constexpr int kMaxDevices = 64;
cudaStream_t g_default_stream[kMaxDevices] = {};
thread_local cudaStream_t t_override[kMaxDevices] = {};
std::mutex g_mu;

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

bool is_available() { return device_count() > 0; }

void set_device(int index) {
  const int n = device_count();
  DTR_CHECK(index >= 0 && index < n, "cuda::set_device: device ", index, " out of range (", n,
            " CUDA devices visible)");
  DTR_CUDA_CHECK(cudaSetDevice(index));
}

int current_device() {
  int d = 0;
  DTR_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

cudaStream_t current_stream() {
  const int d = current_device();
  DTR_CHECK(d < kMaxDevices, "cuda::current_stream: device index ", d, " >= ", kMaxDevices);
  if (t_override[d]) return t_override[d];
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_default_stream[d]) DTR_CUDA_CHECK(cudaStreamCreateWithFlags(&g_default_stream[d], cudaStreamNonBlocking));
  return g_default_stream[d];
}

void set_current_stream(cudaStream_t s) {
  const int d = current_device();
  DTR_CHECK(d < kMaxDevices, "cuda::set_current_stream: device index ", d, " >= ", kMaxDevices);
  t_override[d] = s;
}

void synchronize() { DTR_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

DeviceGuard::DeviceGuard(int index) {
  const int cur = current_device();
  if (cur == index) return;
  set_device(index);
  prev_ = cur;
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) (void)cudaSetDevice(prev_);  // cannot throw from a destructor
}

}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
