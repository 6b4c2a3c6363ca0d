// CUDA kernels of unary pointwise ops (neg, exp, log, sqrt, rsqrt, abs, sigmoid, tanh, relu,
// silu, gelu, sign), scalar ops (add/sub/mul/div/rsub/pow with a scalar attr), in-place mul_,
// and the scalar comparisons gt_scalar / lt_scalar. Same formulas as
// ops/cpu/pointwise_kernels.cpp; bf16 / f16 compute in f32 and round once, like the CPU's upcast.
// One kernel per element type; the op is a runtime switch (uniform across the grid).
#include <cmath>

#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"

namespace dtr::cuda_ops {
namespace {

enum UnaryOp : int {
  kNeg, kExp, kLog, kSqrt, kRsqrt, kAbs, kSigmoid, kTanh, kRelu, kSilu, kGeluErf, kGeluTanh, kSign,
  kAddS, kSubS, kMulS, kDivS, kRsubS, kPowS
};

template <class A>
__device__ __forceinline__ A unary_math(int op, A x, A y) {
  switch (op) {
    case kNeg: return -x;
    case kExp: return exp(x);
    case kLog: return log(x);
    case kSqrt: return sqrt(x);
    case kRsqrt: return A(1) / sqrt(x);
    case kAbs: return fabs(x);
    case kSigmoid: return A(1) / (A(1) + exp(-x));
    case kTanh: return tanh(x);
    case kRelu: return x > A(0) ? x : A(0);
    case kSilu: return x / (A(1) + exp(-x));
    case kGeluErf: return A(0.5) * x * (A(1) + erf(x * A(0.70710678118654752440)));
    case kGeluTanh:
      return A(0.5) * x * (A(1) + tanh(A(0.79788456080286535588) * (x + A(0.044715) * x * x * x)));
    case kSign: return A((x > A(0)) - (x < A(0)));
    case kAddS: return x + y;
    case kSubS: return x - y;
    case kMulS: return x * y;
    case kDivS: return x / y;
    case kRsubS: return y - x;
    case kPowS: return pow(x, y);
    default: return x;
  }
}

template <class T>
__global__ void unary_kernel(int64_t n, OffsetCalc<2> oc, T* out, const T* in, int op, acc_t<T> y) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    int64_t off[2];
    oc.get(i, off);
    out[off[0]] = store<T>(unary_math<acc_t<T>>(op, load(in[off[1]]), y));
  }
}

/// out[i] = double(x[i]) > s (greater) or < s.
template <class T>
__global__ void compare_scalar_kernel(int64_t n, OffsetCalc<2> oc, bool* out, const T* in, double s, bool greater) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    int64_t off[2];
    oc.get(i, off);
    const double v = static_cast<double>(load(in[off[1]]));
    out[off[0]] = greater ? v > s : v < s;
  }
}

/// out (any strides, x's shape) = op(x, scalar).
void launch_unary(const Tensor& out, const Tensor& x, int op, double scalar, const char* name) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  const auto oc = make_offset_calc<2>(out.sizes(), {out.strides(), x.strides()}, name);
  cudaStream_t s = cuda::current_stream();
  dispatch_floating(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    unary_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(n, oc, static_cast<T*>(out.data_ptr()),
                                                       static_cast<const T*>(x.data_ptr()), op,
                                                       static_cast<acc_t<T>>(scalar));
  });
  DTR_CUDA_CHECK_LAUNCH();
}

std::vector<Tensor> unary(const OpCall& c, int op, double scalar = 0.0) {
  const Tensor& x = c.inputs[0];
  Tensor out = cuda_empty(x.sizes(), x.dtype(), x);
  launch_unary(out, x, op, scalar, c.name());
  return {out};
}

std::vector<Tensor> compare_scalar(const OpCall& c, bool greater) {
  const Tensor& x = c.inputs[0];
  const double sv = c.f(0);
  Tensor out = cuda_empty(x.sizes(), DType::bool_, x);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  DeviceGuard guard(out.device());
  const auto oc = make_offset_calc<2>(out.sizes(), {out.strides(), x.strides()}, c.name());
  cudaStream_t s = cuda::current_stream();
  dispatch_numeric(x.dtype(), c.name(), [&](auto tag) {
    using T = decltype(tag);
    compare_scalar_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(n, oc, static_cast<bool*>(out.data_ptr()),
                                                                static_cast<const T*>(x.data_ptr()), sv, greater);
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

#define DTR_CUDA_UNARY(NAME, OP) \
  std::vector<Tensor> k_##NAME(const OpCall& c) { return unary(c, OP); } \
  DTR_REGISTER_KERNEL(#NAME, DeviceType::CUDA, k_##NAME);
#define DTR_CUDA_SCALAR(NAME, OP) \
  std::vector<Tensor> k_##NAME(const OpCall& c) { return unary(c, OP, c.f(0)); } \
  DTR_REGISTER_KERNEL(#NAME, DeviceType::CUDA, k_##NAME);

DTR_CUDA_UNARY(neg, kNeg)
DTR_CUDA_UNARY(exp, kExp)
DTR_CUDA_UNARY(log, kLog)
DTR_CUDA_UNARY(sqrt, kSqrt)
DTR_CUDA_UNARY(rsqrt, kRsqrt)
DTR_CUDA_UNARY(abs, kAbs)
DTR_CUDA_UNARY(sigmoid, kSigmoid)
DTR_CUDA_UNARY(tanh, kTanh)
DTR_CUDA_UNARY(relu, kRelu)
DTR_CUDA_UNARY(silu, kSilu)
DTR_CUDA_UNARY(gelu_erf, kGeluErf)
DTR_CUDA_UNARY(gelu_tanh, kGeluTanh)
DTR_CUDA_UNARY(sign, kSign)
DTR_CUDA_SCALAR(add_scalar, kAddS)
DTR_CUDA_SCALAR(sub_scalar, kSubS)
DTR_CUDA_SCALAR(mul_scalar, kMulS)
DTR_CUDA_SCALAR(div_scalar, kDivS)
DTR_CUDA_SCALAR(rsub_scalar, kRsubS)
DTR_CUDA_SCALAR(pow_scalar, kPowS)

std::vector<Tensor> k_gt_scalar(const OpCall& c) { return compare_scalar(c, true); }
std::vector<Tensor> k_lt_scalar(const OpCall& c) { return compare_scalar(c, false); }
DTR_REGISTER_KERNEL("gt_scalar", DeviceType::CUDA, k_gt_scalar);
DTR_REGISTER_KERNEL("lt_scalar", DeviceType::CUDA, k_lt_scalar);

/// mul_(a, s): a *= s in place; returns a.
std::vector<Tensor> k_mul_(const OpCall& c) {
  Tensor a = c.inputs[0];
  launch_unary(a, a, kMulS, c.f(0), "mul_");
  return {a};
}
// EXACT like the CPU registration (one upcast flag per op; see pointwise_binary.cu).
DTR_REGISTER_KERNEL_EXACT("mul_", DeviceType::CUDA, k_mul_);

}  // namespace
}  // namespace dtr::cuda_ops
