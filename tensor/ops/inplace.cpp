// In-place arithmetic used by optimizers and gradient bookkeeping. Each bumps the version
// counter (so a tensor saved for backward and changed afterwards is detected) and refuses
// tensors that require grad while grad mode is on.
#include "tensor/autograd/grad_mode.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/shape.h"

namespace dtr {
namespace {

std::vector<Tensor> k_add_(const OpCall& c) {
  Tensor a = c.inputs[0];
  const Tensor b = c.inputs[1].expand(a.sizes());
  const double alpha = c.f(0);
  check_same_dtype(a, b, "add_");
  cpu::dispatch_floating(a.dtype(), "add_", [&](auto tag) {
    using T = decltype(tag);
    const T al = static_cast<T>(alpha);
    cpu::binary_loop<T, T>(a, b, a, [al](T x, T y) { return x + al * y; });
  });
  return {a};
}

std::vector<Tensor> k_mul_(const OpCall& c) {
  Tensor a = c.inputs[0];
  const double s = c.f(0);
  cpu::dispatch_floating(a.dtype(), "mul_", [&](auto tag) {
    using T = decltype(tag);
    const T sv = static_cast<T>(s);
    cpu::unary_loop<T, T>(a, a, [sv](T x) { return x * sv; });
  });
  return {a};
}

DTR_REGISTER_KERNEL_EXACT("add_", DeviceType::CPU, k_add_);
DTR_REGISTER_KERNEL_EXACT("mul_", DeviceType::CPU, k_mul_);

void check_inplace_floating(const Tensor& t, const char* op) {
  check_inplace(t, op);
  DTR_CHECK(t.is_distributed() || is_floating(t.dtype()), op, ": expected a floating tensor, got ", t.dtype());
}

}  // namespace

Tensor& add_(Tensor& a, const Tensor& b, double alpha) {
  check_inplace_floating(a, "add_");
  static const OpDef* op = op_def("add_");
  dispatch(OpCall{op, {a, b}, {alpha}});
  a.bump_version();
  return a;
}

Tensor& mul_(Tensor& a, double s) {
  check_inplace_floating(a, "mul_");
  static const OpDef* op = op_def("mul_");
  dispatch(OpCall{op, {a}, {s}});
  a.bump_version();
  return a;
}

}  // namespace dtr
