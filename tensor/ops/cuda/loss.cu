// CUDA kernels of cross_entropy (fused log-softmax + NLL, mean over non-ignored tokens) and
// cross_entropy_backward ((softmax - onehot) * g / count; ignored rows 0), same semantics as
// ops/cpu/nn_loss_kernels.cpp. Numerically stable: lse = max + log(sum(exp(x - max))), one
// block per row with f32 (f64 for f64) block reductions. The mean is deterministic: per-row
// losses go to a buffer and one block sums them in f64 (like the CPU's f64 total).
// Targets are range-checked first (check_indices: one synchronisation; a target outside
// [0, C) other than ignore_index is a dtr::Error like on the CPU). The count of non-ignored
// tokens stays on the device (no further synchronisation).
#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

/// log-sum-exp of one row, computed by the whole block (every thread gets it).
template <class T>
__device__ acc_t<T> block_row_lse(const T* x, int64_t C) {
  using A = acc_t<T>;
  A m = lowest_of<A>();
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = max_of(m, load(x[j]));
  m = block_max(m);
  if (m == lowest_of<A>()) return m;  // all -inf (the CPU returns -inf too)
  A s = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += exp(load(x[j]) - m);
  s = block_sum(s);
  return m + log(s);
}

/// row_loss[i] = lse(x_i) - x_i[t_i], 0 for ignored rows.
template <class T, class I>
__global__ void ce_rows_kernel(const T* x, const I* targets, acc_t<T>* row_loss, int64_t C, int64_t ignore) {
  const int64_t i = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[i]);
  if (t == ignore) {  // uniform across the block: no thread reaches the block reductions
    if (threadIdx.x == 0) row_loss[i] = 0;
    return;
  }
  const T* row = x + i * C;
  const acc_t<T> lse = block_row_lse(row, C);
  if (threadIdx.x == 0) row_loss[i] = lse - load(row[t]);
}

/// Number of targets != ignore into *count (one block).
template <class I>
__global__ void count_kernel(const I* targets, int64_t N, int64_t ignore, int64_t* count) {
  int64_t c = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) c += static_cast<int64_t>(targets[i]) != ignore;
  c = block_sum(c);
  if (threadIdx.x == 0) *count = c;
}

/// out = sum(row_loss) / count (0 when count == 0), summed in f64 (one block).
template <class T>
__global__ void ce_mean_kernel(const acc_t<T>* row_loss, const int64_t* count, int64_t N, T* out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += static_cast<double>(row_loss[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) *out = store<T>(*count == 0 ? 0.0 : s / static_cast<double>(*count));
}

template <class T, class I>
__global__ void ce_backward_kernel(const T* g, const T* x, const I* targets, const int64_t* count, T* out, int64_t C,
                                   int64_t ignore) {
  using A = acc_t<T>;
  const int64_t i = blockIdx.x;
  const int64_t t = static_cast<int64_t>(targets[i]);
  T* o = out + i * C;
  if (t == ignore) {
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) o[j] = store<T>(A(0));
    return;
  }
  const T* row = x + i * C;
  const A lse = block_row_lse(row, C);
  const int64_t cnt = *count;
  const A k = static_cast<A>(cnt == 0 ? 0.0 : static_cast<double>(load(*g)) / static_cast<double>(cnt));
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    A v = exp(load(row[j]) - lse) * k;
    if (j == t) v -= k;
    o[j] = store<T>(v);
  }
}

/// Calls f(I{}) with the index type of targets (i64 / i32).
template <class F>
void dispatch_index(DType dt, const char* op, F&& f) {
  if (dt == DType::i64) f(int64_t{});
  else if (dt == DType::i32) f(int32_t{});
  else DTR_ERROR(op, ": targets must be int64 or int32, got ", dt);
}

std::vector<Tensor> k_cross_entropy(const OpCall& c) {
  const Tensor& x0 = c.inputs[0];
  const int64_t N = x0.sizes()[0], C = x0.sizes()[1], ignore = c.i(0);
  Tensor out = cuda_empty({}, x0.dtype(), x0);
  DeviceGuard guard(x0.device());
  const Tensor x = cuda_contiguous(x0), tg = cuda_contiguous(c.inputs[1]);
  check_indices(tg, C, ignore, "cross_entropy", "target");
  cudaStream_t s = cuda::current_stream();
  Tensor count = cuda_empty({1}, DType::i64, x);
  dispatch_floating(x.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    Tensor row_loss = cuda_empty({std::max<int64_t>(N, 1)}, dtype_of_acc<A>(), x);
    dispatch_index(tg.dtype(), "cross_entropy", [&](auto itag) {
      using I = decltype(itag);
      const I* pt = static_cast<const I*>(tg.data_ptr());
      if (N > 0 && C > 0) {
        ce_rows_kernel<T, I><<<static_cast<unsigned>(N), threads_for_row(C), 0, s>>>(
            static_cast<const T*>(x.data_ptr()), pt, static_cast<A*>(row_loss.data_ptr()), C, ignore);
        DTR_CUDA_CHECK_LAUNCH();
      }
      count_kernel<I><<<1, kThreads, 0, s>>>(pt, N, ignore, static_cast<int64_t*>(count.data_ptr()));
      DTR_CUDA_CHECK_LAUNCH();
    });
    ce_mean_kernel<T><<<1, kThreads, 0, s>>>(static_cast<const A*>(row_loss.data_ptr()),
                                             static_cast<const int64_t*>(count.data_ptr()), C > 0 ? N : 0,
                                             static_cast<T*>(out.data_ptr()));
    DTR_CUDA_CHECK_LAUNCH();
  });
  return {out};
}

/// inputs {g (0-d), logits [N, C], targets [N]}, attrs {ignore_index} -> dlogits.
std::vector<Tensor> k_cross_entropy_backward(const OpCall& c) {
  const Tensor& x0 = c.inputs[1];
  const int64_t N = x0.sizes()[0], C = x0.sizes()[1], ignore = c.i(0);
  DTR_CHECK(c.inputs[0].numel() == 1 && c.inputs[0].dtype() == x0.dtype(),
            "cross_entropy_backward: gradient must be a one-element ", x0.dtype(), " tensor, got ", c.inputs[0].sizes(),
            " ", c.inputs[0].dtype());
  Tensor out = cuda_empty(x0.sizes(), x0.dtype(), x0);
  if (N == 0 || C == 0) return {out};
  DeviceGuard guard(x0.device());
  const Tensor x = cuda_contiguous(x0), tg = cuda_contiguous(c.inputs[2]);
  check_indices(tg, C, ignore, "cross_entropy_backward", "target");
  cudaStream_t s = cuda::current_stream();
  Tensor count = cuda_empty({1}, DType::i64, x);
  dispatch_floating(x.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(tg.dtype(), "cross_entropy_backward", [&](auto itag) {
      using I = decltype(itag);
      const I* pt = static_cast<const I*>(tg.data_ptr());
      count_kernel<I><<<1, kThreads, 0, s>>>(pt, N, ignore, static_cast<int64_t*>(count.data_ptr()));
      DTR_CUDA_CHECK_LAUNCH();
      ce_backward_kernel<T, I><<<static_cast<unsigned>(N), threads_for_row(C), 0, s>>>(
          static_cast<const T*>(c.inputs[0].data_ptr()), static_cast<const T*>(x.data_ptr()), pt,
          static_cast<const int64_t*>(count.data_ptr()), static_cast<T*>(out.data_ptr()), C, ignore);
      DTR_CUDA_CHECK_LAUNCH();
    });
  });
  return {out};
}

DTR_REGISTER_KERNEL("cross_entropy", DeviceType::CUDA, k_cross_entropy);
DTR_REGISTER_KERNEL("cross_entropy_backward", DeviceType::CUDA, k_cross_entropy_backward);

}  // namespace
}  // namespace dtr::cuda_ops
