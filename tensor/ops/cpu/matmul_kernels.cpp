// CPU kernels of mm, bmm and addmm_ on strided operands (transposed views need no copy).
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/gemm.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/shape.h"

namespace dtr {
namespace {

/// True when the GEMM can read the last two dims of t in place (one unit stride).
bool gemm_ok(const Tensor& t) {
  const int64_t d = t.dim();
  const int64_t r = t.sizes()[d - 2], c = t.sizes()[d - 1];
  const int64_t rs = t.strides()[d - 2], cs = t.strides()[d - 1];
  return cs == 1 || c == 1 || rs == 1 || r == 1;
}

Tensor gemm_operand(const Tensor& t) { return gemm_ok(t) ? t : t.contiguous(); }

std::vector<Tensor> k_mm(const OpCall& c) {
  const Tensor a = gemm_operand(c.inputs[0]);
  const Tensor b = gemm_operand(c.inputs[1]);
  const int64_t m = a.sizes()[0], k = a.sizes()[1], n = b.sizes()[1];
  Tensor out = empty({m, n}, TensorOptions(a.dtype()));
  cpu::dispatch_floating(a.dtype(), "mm", [&](auto tag) {
    using T = decltype(tag);
    cpu::gemm<T>(m, n, k, static_cast<const T*>(a.data_ptr()), a.strides()[0], a.strides()[1],
                 static_cast<const T*>(b.data_ptr()), b.strides()[0], b.strides()[1], static_cast<T*>(out.data_ptr()),
                 false);
  });
  return {out};
}

/// self += a x b: the GEMM accumulates straight into a contiguous self; another layout takes
/// the product and an elementwise add.
std::vector<Tensor> k_addmm_(const OpCall& c) {
  Tensor self = c.inputs[0];
  const Tensor a = gemm_operand(c.inputs[1]);
  const Tensor b = gemm_operand(c.inputs[2]);
  const int64_t m = a.sizes()[0], k = a.sizes()[1], n = b.sizes()[1];
  cpu::dispatch_floating(self.dtype(), "addmm_", [&](auto tag) {
    using T = decltype(tag);
    auto product = [&](T* out, bool acc) {
      cpu::gemm<T>(m, n, k, static_cast<const T*>(a.data_ptr()), a.strides()[0], a.strides()[1],
                   static_cast<const T*>(b.data_ptr()), b.strides()[0], b.strides()[1], out, acc);
    };
    if (self.is_contiguous()) {
      product(static_cast<T*>(self.data_ptr()), true);
    } else {
      Tensor p = empty({m, n}, TensorOptions(self.dtype()));
      product(static_cast<T*>(p.data_ptr()), false);
      cpu::binary_loop<T, T>(self, p, self, [](T x, T y) { return x + y; });
    }
  });
  return {self};
}

std::vector<Tensor> k_bmm(const OpCall& c) {
  const Tensor a = gemm_operand(c.inputs[0]);
  const Tensor b = gemm_operand(c.inputs[1]);
  const int64_t B = a.sizes()[0], m = a.sizes()[1], k = a.sizes()[2], n = b.sizes()[2];
  Tensor out = empty({B, m, n}, TensorOptions(a.dtype()));
  cpu::dispatch_floating(a.dtype(), "bmm", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    auto one = [&](int64_t i) {
      cpu::gemm<T>(m, n, k, pa + i * a.strides()[0], a.strides()[1], a.strides()[2], pb + i * b.strides()[0],
                   b.strides()[1], b.strides()[2], po + i * m * n, false);
    };
    // Small matrices: one GEMM per thread; large ones: each GEMM runs parallel inside.
    if (B > 1 && m * n * k < (1 << 21)) {
#pragma omp parallel for schedule(dynamic)
      for (int64_t i = 0; i < B; ++i) one(i);
    } else {
      for (int64_t i = 0; i < B; ++i) one(i);
    }
  });
  return {out};
}

DTR_REGISTER_KERNEL("mm", DeviceType::CPU, k_mm);
DTR_REGISTER_KERNEL("bmm", DeviceType::CPU, k_bmm);
DTR_REGISTER_KERNEL_EXACT("addmm_", DeviceType::CPU, k_addmm_);

}  // namespace
}  // namespace dtr
