// CUDA kernels of moe_permute, moe_permute_backward, moe_unpermute and moe_unpermute_backward, same semantics
// and summation order (j = 0..k-1 per token, f32 accumulation for bf16 / f16) as
// ops/cpu/moe_permute_kernels.cpp: one block per token, threads over the hidden dim.
// slot_position is range-checked (check_indices, one synchronisation); moe_permute's output and
// dys are zeroed first, so a position no slot names stays 0 (the CPU kernel refuses a slot_position that is not a
// permutation; the MoE routing always builds one).
#include <climits>

#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

template <class T>
__global__ void permute_kernel(const T* x, const int64_t* pos, T* out, int64_t k, int64_t H) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    const T v = x[t * H + h];
    for (int64_t j = 0; j < k; ++j) out[pos[t * k + j] * H + h] = v;
  }
}

template <class T>
__global__ void permute_backward_kernel(const T* g, const int64_t* pos, T* dx, int64_t k, int64_t H) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    acc_t<T> acc = 0;
    for (int64_t j = 0; j < k; ++j) acc += load(g[pos[t * k + j] * H + h]);
    dx[t * H + h] = store<T>(acc);
  }
}

template <class T>
__global__ void unpermute_kernel(const T* ys, const int64_t* pos, const T* probs, T* out, int64_t k, int64_t H) {
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    acc_t<T> acc = 0;
    for (int64_t j = 0; j < k; ++j) acc += load(probs[t * k + j]) * load(ys[pos[t * k + j] * H + h]);
    out[t * H + h] = store<T>(acc);
  }
}

template <class T>
__global__ void unpermute_backward_kernel(const T* g, const T* ys, const int64_t* pos, const T* probs, T* dys,
                                          T* dprobs, int64_t k, int64_t H) {
  const int64_t t = blockIdx.x;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = pos[t * k + j];
    const acc_t<T> w = load(probs[t * k + j]);
    acc_t<T> dot = 0;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      const acc_t<T> gv = load(g[t * H + h]);
      dys[p * H + h] = store<T>(w * gv);
      dot += gv * load(ys[p * H + h]);
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dprobs[t * k + j] = store<T>(dot);
  }
}

int threads_for(int64_t H) { return H >= kThreads ? kThreads : static_cast<int>(((H + 31) / 32) * 32); }

std::vector<Tensor> k_moe_permute(const OpCall& c) {
  const int64_t k = c.i(0), N = c.inputs[0].size(0), H = c.inputs[0].size(1), M = N * k;
  Tensor out = cuda_empty({M, H}, c.inputs[0].dtype(), c.inputs[0]);
  if (out.numel() == 0) return {out};
  DeviceGuard guard(out.device());
  cuda_zero(out);  // rows no slot names (slot_position not a permutation) stay 0
  const Tensor x = cuda_contiguous(c.inputs[0]), pos = cuda_contiguous(c.inputs[1]);
  check_indices(pos, M, INT64_MIN, "moe_permute", "slot_position");
  dispatch_floating(x.dtype(), "moe_permute", [&](auto tag) {
    using T = decltype(tag);
    permute_kernel<T><<<static_cast<unsigned>(N), threads_for(H), 0, cuda::current_stream()>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const int64_t*>(pos.data_ptr()),
        static_cast<T*>(out.data_ptr()), k, H);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

std::vector<Tensor> k_moe_permute_backward(const OpCall& c) {
  const int64_t k = c.i(0);
  DTR_CHECK(k > 0 && c.inputs[0].dim() == 2 && c.inputs[0].size(0) % k == 0, "moe_permute_backward: gradient ",
            c.inputs[0].sizes(), " (expected [N*", k, ", H] with k > 0)");
  const int64_t M = c.inputs[0].size(0), H = c.inputs[0].size(1), N = M / k;
  Tensor dx = cuda_empty({N, H}, c.inputs[0].dtype(), c.inputs[0]);
  if (dx.numel() == 0) return {dx};
  DeviceGuard guard(dx.device());
  const Tensor g = cuda_contiguous(c.inputs[0]), pos = cuda_contiguous(c.inputs[1]);
  check_indices(pos, M, INT64_MIN, "moe_permute_backward", "slot_position");
  dispatch_floating(g.dtype(), "moe_permute_backward", [&](auto tag) {
    using T = decltype(tag);
    permute_backward_kernel<T><<<static_cast<unsigned>(N), threads_for(H), 0, cuda::current_stream()>>>(
        static_cast<const T*>(g.data_ptr()), static_cast<const int64_t*>(pos.data_ptr()),
        static_cast<T*>(dx.data_ptr()), k, H);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {dx};
}

std::vector<Tensor> k_moe_unpermute(const OpCall& c) {
  const int64_t M = c.inputs[0].size(0), H = c.inputs[0].size(1), N = c.inputs[2].size(0), k = c.inputs[2].size(1);
  Tensor out = cuda_empty({N, H}, c.inputs[0].dtype(), c.inputs[0]);
  if (out.numel() == 0) return {out};
  DeviceGuard guard(out.device());
  const Tensor ys = cuda_contiguous(c.inputs[0]), pos = cuda_contiguous(c.inputs[1]),
               probs = cuda_contiguous(c.inputs[2]);
  check_indices(pos, M, INT64_MIN, "moe_unpermute", "slot_position");
  dispatch_floating(ys.dtype(), "moe_unpermute", [&](auto tag) {
    using T = decltype(tag);
    unpermute_kernel<T><<<static_cast<unsigned>(N), threads_for(H), 0, cuda::current_stream()>>>(
        static_cast<const T*>(ys.data_ptr()), static_cast<const int64_t*>(pos.data_ptr()),
        static_cast<const T*>(probs.data_ptr()), static_cast<T*>(out.data_ptr()), k, H);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

std::vector<Tensor> k_moe_unpermute_backward(const OpCall& c) {
  const int64_t M = c.inputs[1].size(0), H = c.inputs[1].size(1), N = c.inputs[3].size(0), k = c.inputs[3].size(1);
  Tensor dys = cuda_empty({M, H}, c.inputs[1].dtype(), c.inputs[1]);
  Tensor dprobs = cuda_empty({N, k}, c.inputs[1].dtype(), c.inputs[1]);
  if (dys.numel() == 0) return {dys, dprobs};
  DeviceGuard guard(dys.device());
  cuda_zero(dys);
  const Tensor g = cuda_contiguous(c.inputs[0]), ys = cuda_contiguous(c.inputs[1]),
               pos = cuda_contiguous(c.inputs[2]), probs = cuda_contiguous(c.inputs[3]);
  check_indices(pos, M, INT64_MIN, "moe_unpermute_backward", "slot_position");
  dispatch_floating(ys.dtype(), "moe_unpermute_backward", [&](auto tag) {
    using T = decltype(tag);
    unpermute_backward_kernel<T><<<static_cast<unsigned>(N), threads_for(H), 0, cuda::current_stream()>>>(
        static_cast<const T*>(g.data_ptr()), static_cast<const T*>(ys.data_ptr()),
        static_cast<const int64_t*>(pos.data_ptr()), static_cast<const T*>(probs.data_ptr()),
        static_cast<T*>(dys.data_ptr()), static_cast<T*>(dprobs.data_ptr()), k, H);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {dys, dprobs};
}

DTR_REGISTER_KERNEL("moe_permute", DeviceType::CUDA, k_moe_permute);
DTR_REGISTER_KERNEL("moe_permute_backward", DeviceType::CUDA, k_moe_permute_backward);
DTR_REGISTER_KERNEL("moe_unpermute", DeviceType::CUDA, k_moe_unpermute);
DTR_REGISTER_KERNEL("moe_unpermute_backward", DeviceType::CUDA, k_moe_unpermute_backward);

}  // namespace
}  // namespace dtr::cuda_ops
