// CUDA kernels of rotary_embedding (HF rotate-half layout) and rotary_embedding_backward
// (with respect to x), same formulas as ops/cpu/nn_rope_kernels.cpp. x (or g) is made
// contiguous and viewed as [rows, D]; cos / sin broadcast to x with stride-0 dims. One thread
// per pair (j, j + D/2) of a row:
//   forward:  o[j] = x1 c1 - x2 s1,  o[j+h] = x2 c2 + x1 s2
//   backward: o[j] = g1 c1 + g2 s2,  o[j+h] = g2 c2 - g1 s1
#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

template <class T, bool kBackward>
__global__ void rope_kernel(const T* x, const T* cs, const T* sn, T* out, int64_t rows, int64_t h, OffsetCalc<2> row_oc,
                            int64_t cd, int64_t sd) {
  using A = acc_t<T>;
  DTR_GRID_STRIDE_LOOP(e, rows * h) {
    const int64_t r = e / h, j = e % h, D = 2 * h;
    int64_t off[2];
    row_oc.get(r, off);
    const T* cr = cs + off[0];
    const T* sr = sn + off[1];
    const A x1 = load(x[r * D + j]), x2 = load(x[r * D + j + h]);
    const A c1 = load(cr[j * cd]), c2 = load(cr[(j + h) * cd]), s1 = load(sr[j * sd]), s2 = load(sr[(j + h) * sd]);
    if constexpr (kBackward) {
      out[r * D + j] = store<T>(x1 * c1 + x2 * s2);
      out[r * D + j + h] = store<T>(x2 * c2 - x1 * s1);
    } else {
      out[r * D + j] = store<T>(x1 * c1 - x2 * s1);
      out[r * D + j + h] = store<T>(x2 * c2 + x1 * s2);
    }
  }
}

template <bool kBackward>
std::vector<Tensor> k_rope(const OpCall& c) {
  const Tensor& x0 = c.inputs[0];
  const Tensor& cs = c.inputs[1];
  const Tensor& sn = c.inputs[2];
  DTR_CHECK(x0.dtype() == cs.dtype() && x0.dtype() == sn.dtype(), "rotary_embedding: dtype mismatch: x ", x0.dtype(),
            ", cos ", cs.dtype(), ", sin ", sn.dtype());
  Tensor out = cuda_empty(x0.sizes(), x0.dtype(), x0);
  const int64_t D = x0.sizes().back(), h = D / 2, rows = D == 0 ? 0 : x0.numel() / D;
  if (rows == 0 || h == 0) return {out};
  DeviceGuard guard(x0.device());
  const Tensor x = cuda_contiguous(x0);
  const Shape cst = broadcast_strides_to(cs, x.sizes()), sst = broadcast_strides_to(sn, x.sizes());
  const Shape row_shape(x.sizes().begin(), x.sizes().end() - 1);
  const auto row_oc = make_offset_calc<2>(row_shape,
                                          {Shape(cst.begin(), cst.end() - 1), Shape(sst.begin(), sst.end() - 1)},
                                          "rotary_embedding");
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(x.dtype(), "rotary_embedding", [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T, kBackward><<<blocks_for(rows * h), kThreads, 0, s>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(cs.data_ptr()), static_cast<const T*>(sn.data_ptr()),
        static_cast<T*>(out.data_ptr()), rows, h, row_oc, cst.back(), sst.back());
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

DTR_REGISTER_KERNEL("rotary_embedding", DeviceType::CUDA, k_rope<false>);
DTR_REGISTER_KERNEL("rotary_embedding_backward", DeviceType::CUDA, k_rope<true>);

}  // namespace
}  // namespace dtr::cuda_ops
