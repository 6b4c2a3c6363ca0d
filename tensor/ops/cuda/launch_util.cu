// Host helpers of the CUDA kernels (see launch_util.cuh): device guard, strided same-dtype copy
// (by element size, so one kernel serves every dtype), zero fill, index range checks.
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

/// dst[oc(i)[0]] = src[oc(i)[1]] for elements of W bytes.
template <class W>
__global__ void strided_copy_kernel(int64_t n, OffsetCalc<2> oc, W* dst, const W* src) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    int64_t off[2];
    oc.get(i, off);
    dst[off[0]] = src[off[1]];
  }
}

/// Writes into *first the smallest position whose value is out of [0, hi) and != ignore.
template <class I>
__global__ void find_bad_index_kernel(int64_t n, const I* ids, int64_t hi, int64_t ignore,
                                      unsigned long long* first) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    const int64_t v = static_cast<int64_t>(ids[i]);
    if (v != ignore && (v < 0 || v >= hi)) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

}  // namespace

Shape broadcast_strides_to(const Tensor& t, const Shape& shape) {
  const int64_t nd = static_cast<int64_t>(shape.size()), td = t.dim();
  DTR_CHECK(td <= nd, "broadcast: tensor of shape ", t.sizes(), " has more dims than ", shape);
  Shape st(shape.size(), 0);
  for (int64_t i = 0; i < td; ++i) {
    const int64_t d = nd - td + i;
    const int64_t s = t.sizes()[i];
    DTR_CHECK(s == shape[d] || s == 1, "broadcast: shape ", t.sizes(), " does not broadcast to ", shape);
    st[d] = s == 1 ? 0 : t.strides()[i];
  }
  return st;
}

DeviceGuard::DeviceGuard(Device d) {
  DTR_CHECK(d.is_cuda(), "DeviceGuard: expected a CUDA device, got ", d);
  int cur = 0;
  DTR_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != d.index) {
    DTR_CUDA_CHECK(cudaSetDevice(d.index));
    prev_ = cur;
  }
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) (void)cudaSetDevice(prev_);
}

void cuda_copy_same_dtype(const Tensor& dst, const Tensor& src, const char* op) {
  DTR_CHECK(dst.sizes() == src.sizes() && dst.dtype() == src.dtype(), op, ": copy of ", src.sizes(), " ", src.dtype(),
            " into ", dst.sizes(), " ", dst.dtype());
  DTR_CHECK(dst.device().is_cuda() && src.device() == dst.device(), op, ": copy from ", src.device(), " to ",
            dst.device(), " (expected one CUDA device)");
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceGuard guard(dst.device());
  const auto oc = make_offset_calc<2>(dst.sizes(), {dst.strides(), src.strides()}, op);
  cudaStream_t s = cuda::current_stream();
  auto launch = [&](auto w) {
    using W = decltype(w);
    strided_copy_kernel<W><<<blocks_for(n), kThreads, 0, s>>>(n, oc, static_cast<W*>(dst.data_ptr()),
                                                              static_cast<const W*>(src.data_ptr()));
  };
  switch (itemsize(dst.dtype())) {
    case 1: launch(uint8_t{}); break;
    case 2: launch(uint16_t{}); break;
    case 4: launch(uint32_t{}); break;
    case 8: launch(uint64_t{}); break;
    default: DTR_ERROR(op, ": unsupported element size ", itemsize(dst.dtype()));
  }
  DTR_CUDA_CHECK_LAUNCH();
}

Tensor cuda_contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = cuda_empty(t.sizes(), t.dtype(), t);
  cuda_copy_same_dtype(out, t, "contiguous");
  return out;
}

void cuda_zero(const Tensor& t) {
  DTR_CHECK(t.is_contiguous(), "cuda_zero: expected a contiguous tensor, got strides ", t.strides());
  if (t.numel() == 0) return;
  DeviceGuard guard(t.device());
  DTR_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), cuda::current_stream()));
}

void check_indices(const Tensor& ids, int64_t hi, int64_t ignore, const char* op, const char* what) {
  DTR_CHECK(ids.dtype() == DType::i64 || ids.dtype() == DType::i32, op, ": indices must be int64 or int32, got ",
            ids.dtype());
  DTR_CHECK(ids.is_contiguous(), op, ": check_indices expects contiguous indices");
  const int64_t n = ids.numel();
  if (n == 0) return;
  DeviceGuard guard(ids.device());
  cudaStream_t s = cuda::current_stream();
  Tensor flag = cuda_empty({1}, DType::i64, ids);
  auto* first = static_cast<unsigned long long*>(flag.data_ptr());
  DTR_CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof(unsigned long long), s));
  if (ids.dtype() == DType::i64)
    find_bad_index_kernel<<<blocks_for(n), kThreads, 0, s>>>(n, static_cast<const int64_t*>(ids.data_ptr()), hi,
                                                              ignore, first);
  else
    find_bad_index_kernel<<<blocks_for(n), kThreads, 0, s>>>(n, static_cast<const int32_t*>(ids.data_ptr()), hi,
                                                              ignore, first);
  DTR_CUDA_CHECK_LAUNCH();
  unsigned long long pos = 0;
  DTR_CUDA_CHECK(cudaMemcpyAsync(&pos, first, sizeof(pos), cudaMemcpyDeviceToHost, s));
  DTR_CUDA_CHECK(cudaStreamSynchronize(s));
  if (pos == ~0ull) return;
  int64_t value = 0;
  const size_t isz = itemsize(ids.dtype());
  if (isz == 8) {
    DTR_CUDA_CHECK(cudaMemcpy(&value, static_cast<const char*>(ids.data_ptr()) + pos * isz, 8, cudaMemcpyDeviceToHost));
  } else {
    int32_t v32 = 0;
    DTR_CUDA_CHECK(cudaMemcpy(&v32, static_cast<const char*>(ids.data_ptr()) + pos * isz, 4, cudaMemcpyDeviceToHost));
    value = v32;
  }
  DTR_ERROR(op, ": ", what, " ", value, " at position ", pos, " (flat index into shape ", ids.sizes(),
            ") is out of range [0, ", hi, ")");
}

}  // namespace dtr::cuda_ops
