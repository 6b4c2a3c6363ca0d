// CUDA kernels of binary pointwise ops with broadcasting (add, sub, mul, div, maximum,
// gelu_backward, silu_backward, in-place add_), eq and where. Same semantics as ops/cpu/pointwise_kernels.cpp
// and ops/inplace.cpp: output contiguous with the broadcast shape and the inputs' dtype
// (bool for eq); integer division by zero gives 0. bf16 / f16 compute in f32 and round once.
// One kernel per element type with the op chosen by a runtime switch (uniform across the
// grid), which keeps the number of instantiations (and nvcc time) small.
#include <cmath>

#include "tensor/dispatch.h"
#include "tensor/ops/cuda/launch_util.cuh"
#include "tensor/ops/shape.h"

namespace dtr::cuda_ops {
namespace {

enum BinaryOp : int { kAdd, kSub, kMul, kDiv, kMaximum, kGeluBwdErf, kGeluBwdTanh, kSiluBwd, kAddScaled };

template <class A>
__device__ __forceinline__ A binary_math(int op, A x, A y, A alpha) {
  switch (op) {
    case kAdd: return x + y;
    case kSub: return x - y;
    case kMul: return x * y;
    case kDiv:
      if constexpr (std::is_integral_v<A>) return y == 0 ? A(0) : x / y;
      else return x / y;
    case kMaximum: return x > y ? x : y;
    case kAddScaled: return x + alpha * y;
    default: break;
  }
  if constexpr (std::is_floating_point_v<A>) {
    // gelu_backward(g = x, input = y): formulas of the CPU kernel.
    const A g = x, v = y;
    if (op == kSiluBwd) {  // g * s * (1 + v * (1 - s)), s = sigmoid(v), the CPU's operation order
      const A sg = A(1) / (A(1) + exp(-v));
      return g * (sg * (v * (A(1) - sg) + A(1)));
    }
    if (op == kGeluBwdTanh) {
      const A k = A(0.79788456080286535588), a = A(0.044715);
      const A u = k * (v + a * v * v * v);
      const A t = tanh(u);
      const A du = k * (A(1) + A(3) * a * v * v);
      return g * (A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * du);
    }
    const A cdf = A(0.5) * (A(1) + erf(v * A(0.70710678118654752440)));
    const A pdf = exp(A(-0.5) * v * v) * A(0.39894228040143267794);
    return g * (cdf + v * pdf);
  }
  return A(0);
}

template <class T>
__global__ void binary_kernel(int64_t n, OffsetCalc<3> oc, T* out, const T* a, const T* b, int op, acc_t<T> alpha) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    int64_t off[3];
    oc.get(i, off);
    out[off[0]] = store<T>(binary_math<acc_t<T>>(op, load(a[off[1]]), load(b[off[2]]), alpha));
  }
}

template <class T>
__global__ void eq_kernel(int64_t n, OffsetCalc<3> oc, bool* out, const T* a, const T* b) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    int64_t off[3];
    oc.get(i, off);
    out[off[0]] = load(a[off[1]]) == load(b[off[2]]);
  }
}

template <class T>
__global__ void where_kernel(int64_t n, OffsetCalc<4> oc, T* out, const uint8_t* c, const T* a, const T* b) {
  DTR_GRID_STRIDE_LOOP(i, n) {
    int64_t off[4];
    oc.get(i, off);
    out[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

/// Runs op on a, b (broadcast to `out`'s shape) into `out` (any strides).
void launch_binary(const Tensor& out, const Tensor& a, const Tensor& b, int op, double alpha, const char* name) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  const Shape& shape = out.sizes();
  const auto oc = make_offset_calc<3>(
      shape, {out.strides(), broadcast_strides_to(a, shape), broadcast_strides_to(b, shape)}, name);
  cudaStream_t s = cuda::current_stream();
  dispatch_numeric(a.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(n, oc, static_cast<T*>(out.data_ptr()),
                                                        static_cast<const T*>(a.data_ptr()),
                                                        static_cast<const T*>(b.data_ptr()), op,
                                                        static_cast<acc_t<T>>(alpha));
  });
  DTR_CUDA_CHECK_LAUNCH();
}

std::vector<Tensor> binary(const OpCall& c, int op) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  check_same_dtype(a, b, c.name());
  Tensor out = cuda_empty(broadcast_shapes(a.sizes(), b.sizes(), c.name()), a.dtype(), a);
  launch_binary(out, a, b, op, 0.0, c.name());
  return {out};
}

std::vector<Tensor> k_add(const OpCall& c) { return binary(c, kAdd); }
std::vector<Tensor> k_sub(const OpCall& c) { return binary(c, kSub); }
std::vector<Tensor> k_mul(const OpCall& c) { return binary(c, kMul); }
std::vector<Tensor> k_div(const OpCall& c) { return binary(c, kDiv); }
std::vector<Tensor> k_maximum(const OpCall& c) { return binary(c, kMaximum); }
/// gelu_backward(g, x), attrs {approximate}.
std::vector<Tensor> k_gelu_backward(const OpCall& c) {
  DTR_CHECK(is_floating(c.inputs[0].dtype()), "gelu_backward: expected floating tensors, got ", c.inputs[0].dtype());
  return binary(c, c.b(0) ? kGeluBwdTanh : kGeluBwdErf);
}

/// silu_backward(g, x) = g * d/dx (x * sigmoid(x)).
std::vector<Tensor> k_silu_backward(const OpCall& c) {
  DTR_CHECK(is_floating(c.inputs[0].dtype()), "silu_backward: expected floating tensors, got ", c.inputs[0].dtype());
  return binary(c, kSiluBwd);
}

/// add_(a, b, alpha): a += alpha * b in place (b broadcast to a); returns a.
std::vector<Tensor> k_add_(const OpCall& c) {
  Tensor a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  check_same_dtype(a, b, "add_");
  DTR_CHECK(is_floating(a.dtype()), "add_: expected a floating tensor, got ", a.dtype());
  launch_binary(a, a, b, kAddScaled, c.f(0), "add_");
  return {a};
}

std::vector<Tensor> k_eq(const OpCall& c) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  check_same_dtype(a, b, "eq");
  Tensor out = cuda_empty(broadcast_shapes(a.sizes(), b.sizes(), "eq"), DType::bool_, a);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  DeviceGuard guard(out.device());
  const Shape& shape = out.sizes();
  const auto oc = make_offset_calc<3>(
      shape, {out.strides(), broadcast_strides_to(a, shape), broadcast_strides_to(b, shape)}, "eq");
  cudaStream_t s = cuda::current_stream();
  dispatch_numeric(a.dtype(), "eq", [&](auto tag) {
    using T = decltype(tag);
    eq_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(n, oc, static_cast<bool*>(out.data_ptr()),
                                                    static_cast<const T*>(a.data_ptr()),
                                                    static_cast<const T*>(b.data_ptr()));
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

/// where(cond, a, b): cond (bool / u8) broadcast with a and b.
std::vector<Tensor> k_where(const OpCall& c) {
  const Tensor& cond = c.inputs[0];
  const Tensor& a = c.inputs[1];
  const Tensor& b = c.inputs[2];
  check_same_dtype(a, b, "where");
  DTR_CHECK(cond.dtype() == DType::bool_ || cond.dtype() == DType::u8, "where: condition must be bool, got ",
            cond.dtype());
  const Shape shape = broadcast_shapes(cond.sizes(), broadcast_shapes(a.sizes(), b.sizes(), "where"), "where");
  Tensor out = cuda_empty(shape, a.dtype(), a);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  DeviceGuard guard(out.device());
  const auto oc = make_offset_calc<4>(shape,
                                      {out.strides(), broadcast_strides_to(cond, shape),
                                       broadcast_strides_to(a, shape), broadcast_strides_to(b, shape)},
                                      "where");
  cudaStream_t s = cuda::current_stream();
  dispatch_numeric(a.dtype(), "where", [&](auto tag) {
    using T = decltype(tag);
    where_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(n, oc, static_cast<T*>(out.data_ptr()),
                                                       static_cast<const uint8_t*>(cond.data_ptr()),
                                                       static_cast<const T*>(a.data_ptr()),
                                                       static_cast<const T*>(b.data_ptr()));
  });
  DTR_CUDA_CHECK_LAUNCH();
  return {out};
}

DTR_REGISTER_KERNEL("add", DeviceType::CUDA, k_add);
DTR_REGISTER_KERNEL("sub", DeviceType::CUDA, k_sub);
DTR_REGISTER_KERNEL("mul", DeviceType::CUDA, k_mul);
DTR_REGISTER_KERNEL("div", DeviceType::CUDA, k_div);
DTR_REGISTER_KERNEL("maximum", DeviceType::CUDA, k_maximum);
DTR_REGISTER_KERNEL("gelu_backward", DeviceType::CUDA, k_gelu_backward);
DTR_REGISTER_KERNEL("silu_backward", DeviceType::CUDA, k_silu_backward);
DTR_REGISTER_KERNEL("eq", DeviceType::CUDA, k_eq);
DTR_REGISTER_KERNEL("where", DeviceType::CUDA, k_where);
// EXACT like the CPU registration: OpDef::upcast_low_precision is one flag per op, so the
// CUDA registration must not flip it (an upcast copy would make the in-place update vanish).
DTR_REGISTER_KERNEL_EXACT("add_", DeviceType::CUDA, k_add_);

}  // namespace
}  // namespace dtr::cuda_ops
