// CPU kernels of pointwise ops: binary with broadcasting, scalar, unary, where, comparisons.
// Transcendental unary ops (exp, sigmoid, tanh, silu) and silu_backward on contiguous f32 run
// through Eigen's vectorised packet math (cpu/vec.h) in parallel blocks; every other case
// (f64, strided, broadcast) runs the scalar std:: expression.
#include <algorithm>
#include <cmath>

#include "tensor/dispatch.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/vec.h"
#include "tensor/ops/shape.h"

namespace dtr {
namespace {

/// Division; integer division by zero gives 0 instead of trapping.
template <class T>
inline T div_safe(T x, T y) {
  if constexpr (std::is_integral_v<T>) return y == 0 ? T(0) : x / y;
  else return x / y;
}

template <class F>
std::vector<Tensor> binary(const OpCall& c, F f) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  check_same_dtype(a, b, c.name());
  Tensor out = empty(broadcast_shapes(a.sizes(), b.sizes(), c.name()), TensorOptions(a.dtype()));
  cpu::dispatch_numeric(a.dtype(), c.name(), [&](auto tag) {
    using T = decltype(tag);
    cpu::binary_loop<T, T>(a, b, out, [&](T x, T y) { return static_cast<T>(f(x, y)); });
  });
  return {out};
}

template <class F>
std::vector<Tensor> compare(const OpCall& c, F f) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  check_same_dtype(a, b, c.name());
  Tensor out = empty(broadcast_shapes(a.sizes(), b.sizes(), c.name()), TensorOptions(DType::bool_));
  cpu::dispatch_numeric(a.dtype(), c.name(), [&](auto tag) {
    using T = decltype(tag);
    cpu::binary_loop<T, bool>(a, b, out, [&](T x, T y) { return f(x, y); });
  });
  return {out};
}

template <class F>
std::vector<Tensor> unary(const OpCall& c, F f) {
  const Tensor& a = c.inputs[0];
  Tensor out = empty(a.sizes(), TensorOptions(a.dtype()));
  cpu::dispatch_floating(a.dtype(), c.name(), [&](auto tag) {
    using T = decltype(tag);
    cpu::unary_loop<T, T>(a, out, [&](T x) { return static_cast<T>(f(x)); });
  });
  return {out};
}

/// Elements per block of the vectorised f32 paths (one OpenMP iteration).
constexpr int64_t kVecBlock = 4096;

/// unary() with a vectorised f32 path for contiguous f32 input: `block(in, out, len)` computes
/// one block of at most kVecBlock elements (blocks in parallel); `f` is the scalar expression
/// for every other case.
template <class Block, class F>
std::vector<Tensor> unary_blocks(const OpCall& c, Block block, F f) {
  const Tensor& a = c.inputs[0];
  if (a.dtype() != DType::f32 || !a.is_contiguous()) return unary(c, f);
  Tensor out = empty(a.sizes(), TensorOptions(a.dtype()));
  const float* pa = static_cast<const float*>(a.data_ptr());
  float* po = static_cast<float*>(out.data_ptr());
  const int64_t n = a.numel(), nb = (n + kVecBlock - 1) / kVecBlock;
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kVecBlock;
    block(pa + off, po + off, std::min(kVecBlock, n - off));
  }
  return {out};
}

/// unary_blocks() where `vf` maps an Eigen array expression of a block to its result.
template <class VF, class F>
std::vector<Tensor> unary_vec(const OpCall& c, VF vf, F f) {
  return unary_blocks(
      c, [&](const float* in, float* out, int64_t len) { cpu::vec::MapF(out, len) = vf(cpu::vec::CMapF(in, len)); },
      f);
}

template <class F>
std::vector<Tensor> unary_cmp(const OpCall& c, F f) {
  const Tensor& a = c.inputs[0];
  Tensor out = empty(a.sizes(), TensorOptions(DType::bool_));
  cpu::dispatch_numeric(a.dtype(), c.name(), [&](auto tag) {
    using T = decltype(tag);
    cpu::unary_loop<T, bool>(a, out, [&](T x) { return f(x); });
  });
  return {out};
}

#define BINARY(NAME, EXPR) \
  std::vector<Tensor> k_##NAME(const OpCall& c) { return binary(c, [](auto x, auto y) { return EXPR; }); } \
  DTR_REGISTER_KERNEL(#NAME, DeviceType::CPU, k_##NAME);
#define SCALAR(NAME, EXPR) \
  std::vector<Tensor> k_##NAME(const OpCall& c) { const double s = c.f(0); \
    return unary(c, [s](auto x) { using T = decltype(x); const T y = static_cast<T>(s); (void)y; return EXPR; }); } \
  DTR_REGISTER_KERNEL(#NAME, DeviceType::CPU, k_##NAME);
#define UNARY(NAME, EXPR) \
  std::vector<Tensor> k_##NAME(const OpCall& c) { return unary(c, [](auto x) { using T = decltype(x); (void)sizeof(T); return EXPR; }); } \
  DTR_REGISTER_KERNEL(#NAME, DeviceType::CPU, k_##NAME);

BINARY(add, x + y)
BINARY(sub, x - y)
BINARY(mul, x * y)
BINARY(div, div_safe(x, y))
BINARY(maximum, x > y ? x : y)
SCALAR(add_scalar, x + y)
SCALAR(sub_scalar, x - y)
SCALAR(mul_scalar, x * y)
SCALAR(div_scalar, x / y)
SCALAR(rsub_scalar, y - x)
SCALAR(pow_scalar, std::pow(x, y))
UNARY(neg, -x)
#define UNARY_VEC(NAME, EXPR, VEXPR) \
  std::vector<Tensor> k_##NAME(const OpCall& c) { \
    return unary_vec(c, [](const cpu::vec::CMapF& x) { return VEXPR; }, \
                     [](auto x) { using T = decltype(x); (void)sizeof(T); return EXPR; }); } \
  DTR_REGISTER_KERNEL(#NAME, DeviceType::CPU, k_##NAME);

std::vector<Tensor> k_exp(const OpCall& c) {
  return unary_blocks(
      c, [](const float* in, float* out, int64_t len) { cpu::vec::exp_shift(in, 0.0f, 1.0f, out, len); },
      [](auto x) { return std::exp(x); });
}
DTR_REGISTER_KERNEL("exp", DeviceType::CPU, k_exp);
UNARY(log, std::log(x))
UNARY(sqrt, std::sqrt(x))
UNARY(rsqrt, T(1) / std::sqrt(x))
UNARY(abs, std::abs(x))
UNARY_VEC(sigmoid, T(1) / (T(1) + std::exp(-x)), 1.0f / (1.0f + (-x).exp()))
UNARY_VEC(tanh, std::tanh(x), x.tanh())
UNARY(relu, x > T(0) ? x : T(0))
UNARY_VEC(silu, x / (T(1) + std::exp(-x)), x / (1.0f + (-x).exp()))
UNARY(gelu_erf, T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440))))
UNARY(gelu_tanh, T(0.5) * x * (T(1) + std::tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x))))
UNARY(sign, T((x > T(0)) - (x < T(0))))

std::vector<Tensor> k_eq(const OpCall& c) { return compare(c, [](auto x, auto y) { return x == y; }); }
std::vector<Tensor> k_gt_scalar(const OpCall& c) { const double s = c.f(0); return unary_cmp(c, [s](auto x) { return static_cast<double>(x) > s; }); }
std::vector<Tensor> k_lt_scalar(const OpCall& c) { const double s = c.f(0); return unary_cmp(c, [s](auto x) { return static_cast<double>(x) < s; }); }
DTR_REGISTER_KERNEL("eq", DeviceType::CPU, k_eq);
DTR_REGISTER_KERNEL("gt_scalar", DeviceType::CPU, k_gt_scalar);
DTR_REGISTER_KERNEL("lt_scalar", DeviceType::CPU, k_lt_scalar);

/// where(cond, a, b): cond broadcast with a and b.
std::vector<Tensor> k_where(const OpCall& c) {
  const Tensor& cond = c.inputs[0];
  const Tensor& a = c.inputs[1];
  const Tensor& b = c.inputs[2];
  check_same_dtype(a, b, "where");
  DTR_CHECK(cond.dtype() == DType::bool_ || cond.dtype() == DType::u8, "where: condition must be bool, got ",
            cond.dtype());
  const Shape shape = broadcast_shapes(cond.sizes(), broadcast_shapes(a.sizes(), b.sizes(), "where"), "where");
  Tensor out = empty(shape, TensorOptions(a.dtype()));
  cpu::dispatch_numeric(a.dtype(), "where", [&](auto tag) {
    using T = decltype(tag);
    const uint8_t* pc = static_cast<const uint8_t*>(cond.data_ptr());
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    auto L = cpu::coalesce<4>(shape, {out.strides(), cpu::broadcast_strides(cond, shape),
                                      cpu::broadcast_strides(a, shape), cpu::broadcast_strides(b, shape)});
    cpu::for_each_row(L, [&](const std::array<int64_t, 4>& off, int64_t n, const std::array<int64_t, 4>& st) {
      for (int64_t j = 0; j < n; ++j)
        po[off[0] + j * st[0]] = pc[off[1] + j * st[1]] ? pa[off[2] + j * st[2]] : pb[off[3] + j * st[3]];
    });
  });
  return {out};
}
DTR_REGISTER_KERNEL("where", DeviceType::CPU, k_where);

}  // namespace
}  // namespace dtr

namespace dtr {
namespace {
/// gelu_backward(g, x): g * d/dx gelu(x) for the erf or tanh form.
std::vector<Tensor> k_gelu_backward(const OpCall& c) {
  const bool approx = c.b(0);
  return binary(c, [approx](auto g, auto x) {
    using T = decltype(x);
    if (approx) {
      const T k = T(0.79788456080286535588), a = T(0.044715);
      const T u = k * (x + a * x * x * x);
      const T t = std::tanh(u);
      const T du = k * (T(1) + T(3) * a * x * x);
      return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
    }
    const T cdf = T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440)));
    const T pdf = std::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
    return g * (cdf + x * pdf);
  });
}
DTR_REGISTER_KERNEL("gelu_backward", DeviceType::CPU, k_gelu_backward);
}  // namespace
}  // namespace dtr

namespace dtr {
namespace {
/// silu_backward(g, x) = g * s * (1 + x * (1 - s)), s = sigmoid(x): the derivative of
/// x * sigmoid(x) in one pass (the composed form took six).
std::vector<Tensor> k_silu_backward(const OpCall& c) {
  const Tensor& g = c.inputs[0];
  const Tensor& x = c.inputs[1];
  if (g.dtype() == DType::f32 && x.dtype() == DType::f32 && g.sizes() == x.sizes() && g.is_contiguous() &&
      x.is_contiguous()) {
    Tensor out = empty(x.sizes(), TensorOptions(x.dtype()));
    const float* pg = static_cast<const float*>(g.data_ptr());
    const float* px = static_cast<const float*>(x.data_ptr());
    float* po = static_cast<float*>(out.data_ptr());
    const int64_t n = x.numel(), nb = (n + kVecBlock - 1) / kVecBlock;
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t off = b * kVecBlock, len = std::min(kVecBlock, n - off);
      const cpu::vec::CMapF xv(px + off, len), gv(pg + off, len);
      const cpu::vec::ArrF sv = 1.0f / (1.0f + (-xv).exp());
      cpu::vec::MapF(po + off, len) = gv * sv * (1.0f + xv * (1.0f - sv));
    }
    return {out};
  }
  return binary(c, [](auto gg, auto xx) {
    using T = decltype(xx);
    const T sg = T(1) / (T(1) + std::exp(-xx));
    return gg * (sg * (xx * (T(1) - sg) + T(1)));
  });
}
DTR_REGISTER_KERNEL("silu_backward", DeviceType::CPU, k_silu_backward);
}  // namespace
}  // namespace dtr
