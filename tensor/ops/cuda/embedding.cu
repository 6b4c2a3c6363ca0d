// CUDA kernels of embedding (row gather from a possibly strided weight) and
// embedding_backward (scatter-add of gradient rows), same semantics as
// ops/cpu/nn_embedding_kernels.cpp. Ids are range-checked first (check_indices: one
// synchronisation; an out-of-range id is a dtr::Error like on the CPU).
// Backward is deterministic and sort-based, without atomics: the (id, position) pairs are
// sorted by id with a stable radix sort (CUB), so the positions of each id are contiguous and
// in increasing order; the block of the first position of each run sums the run's gradient
// rows in that order (f32 accumulation, f64 for f64) and writes the weight-gradient row once.
// Rows whose id never occurs stay zero. The summation order equals the CPU's (increasing
// position), so f32 / bf16 results match the CPU bit for bit.
#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

template <class T, class I>
__global__ void embedding_kernel(const I* ids, const T* w, T* out, int64_t n, int64_t dim, int64_t rs, int64_t cs) {
  DTR_GRID_STRIDE_LOOP(e, n * dim) {
    const int64_t i = e / dim, j = e % dim;
    out[e] = w[static_cast<int64_t>(ids[i]) * rs + j * cs];
  }
}

template <class I>
__global__ void make_sort_pairs_kernel(const I* ids, uint32_t* keys, int32_t* pos, int64_t n) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    keys[i] = static_cast<uint32_t>(ids[i]);
    pos[i] = static_cast<int32_t>(i);
  }
}

/// Block p (a sorted position) handles the run of equal keys starting at p, if p starts one.
template <class T>
__global__ void embedding_backward_kernel(const uint32_t* keys, const int32_t* pos, const T* g, T* out, int64_t n,
                                          int64_t dim) {
  const int64_t p = blockIdx.x;
  const uint32_t row = keys[p];
  if (p > 0 && keys[p - 1] == row) return;
  int64_t end = p + 1;
  while (end < n && keys[end] == row) ++end;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    acc_t<T> acc = 0;
    for (int64_t q = p; q < end; ++q) acc += load(g[static_cast<int64_t>(pos[q]) * dim + j]);
    out[static_cast<int64_t>(row) * dim + j] = store<T>(acc);
  }
}

std::vector<Tensor> k_embedding(const OpCall& c) {
  const Tensor& w = c.inputs[1];
  const int64_t num = w.sizes()[0], dim = w.sizes()[1];
  Shape shape = c.inputs[0].sizes();
  shape.push_back(dim);
  Tensor out = cuda_empty(shape, w.dtype(), w);
  const int64_t n = c.inputs[0].numel();
  if (n == 0 || dim == 0) return {out};
  DeviceGuard guard(w.device());
  const Tensor ids = cuda_contiguous(c.inputs[0]);
  check_indices(ids, num, INT64_MIN, "embedding", "id");
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(w.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    const T* pw = static_cast<const T*>(w.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    if (ids.dtype() == DType::i64)
      embedding_kernel<<<blocks_for(n * dim), kThreads, 0, s>>>(static_cast<const int64_t*>(ids.data_ptr()), pw, po, n,
                                                                 dim, w.strides()[0], w.strides()[1]);
    else
      embedding_kernel<<<blocks_for(n * dim), kThreads, 0, s>>>(static_cast<const int32_t*>(ids.data_ptr()), pw, po, n,
                                                                 dim, w.strides()[0], w.strides()[1]);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

/// inputs {g [..., dim], ids [...], optional weight (sharding hint, unused)}, attrs {num}.
std::vector<Tensor> k_embedding_backward(const OpCall& c) {
  const Tensor& g0 = c.inputs[0];
  const Tensor& ids0 = c.inputs[1];
  const int64_t num = c.i(0);
  const int64_t dim = g0.dim() > 0 ? g0.sizes().back() : 1;
  DTR_CHECK(g0.dim() == ids0.dim() + 1 && g0.numel() == ids0.numel() * dim, "embedding_backward: gradient ",
            g0.sizes(), " does not match ids ", ids0.sizes());
  DTR_CHECK(num <= INT32_MAX && ids0.numel() <= INT32_MAX, "embedding_backward: CUDA kernel supports up to 2^31 - 1 ",
            "rows and ids, got num ", num, " and ", ids0.numel(), " ids");
  Tensor out = cuda_empty({num, dim}, g0.dtype(), g0);
  if (out.numel() == 0) return {out};
  DeviceGuard guard(g0.device());
  cuda_zero(out);
  const int64_t n = ids0.numel();
  if (n == 0) return {out};
  const Tensor g = cuda_contiguous(g0), ids = cuda_contiguous(ids0);
  check_indices(ids, num, INT64_MIN, "embedding_backward", "id");
  cudaStream_t s = cuda::current_stream();
  // (key = id, value = position) pairs, sorted by id (stable: positions stay increasing).
  Tensor keys = cuda_empty({2, n}, DType::i32, g), vals = cuda_empty({2, n}, DType::i32, g);
  uint32_t* k_in = static_cast<uint32_t*>(keys.data_ptr());
  uint32_t* k_out = k_in + n;
  int32_t* v_in = static_cast<int32_t*>(vals.data_ptr());
  int32_t* v_out = v_in + n;
  if (ids.dtype() == DType::i64)
    make_sort_pairs_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const int64_t*>(ids.data_ptr()), k_in, v_in, n);
  else
    make_sort_pairs_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const int32_t*>(ids.data_ptr()), k_in, v_in, n);
  DTR_CUDA_CHECK_LAUNCH();
  int end_bit = 1;
  while (end_bit < 32 && (int64_t{1} << end_bit) < num) ++end_bit;
  size_t temp_bytes = 0;
  DTR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k_in, k_out, v_in, v_out, static_cast<int>(n), 0,
                                                 end_bit, s));
  Tensor temp = cuda_empty({static_cast<int64_t>(temp_bytes) + 1}, DType::u8, g);
  DTR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, k_in, k_out, v_in, v_out,
                                                 static_cast<int>(n), 0, end_bit, s));
  const int threads = dim >= kThreads ? kThreads : static_cast<int>(((dim + 31) / 32) * 32);
  dispatch_floating(g.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    embedding_backward_kernel<T><<<static_cast<unsigned>(n), threads, 0, s>>>(
        k_out, v_out, static_cast<const T*>(g.data_ptr()), static_cast<T*>(out.data_ptr()), n, dim);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

DTR_REGISTER_KERNEL("embedding", DeviceType::CUDA, k_embedding);
DTR_REGISTER_KERNEL("embedding_backward", DeviceType::CUDA, k_embedding_backward);

}  // namespace
}  // namespace dtr::cuda_ops
