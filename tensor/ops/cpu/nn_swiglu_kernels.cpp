// CPU kernels of swiglu {gate, up} -> silu(gate) * up and swiglu_backward {g, gate, up} ->
// {dgate, dup}, each one pass over its inputs. Strided inputs are made contiguous first; the
// contiguous arrays are processed in blocks of kBlock elements, OpenMP-parallel over blocks.
// f32 runs Eigen's vectorised exp (cpu/vec.h, same expressions as the silu / silu_backward
// kernels in pointwise_kernels.cpp); f64 the scalar std:: expressions.
//   s = 1 / (1 + exp(-x)): exp overflows to inf for x < -88 (f32), giving s = 0 and silu = -0,
//   the limit; no NaN for finite inputs.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/vec.h"

namespace dtr {
namespace {

/// Elements per block (one OpenMP iteration; one Eigen expression for f32).
constexpr int64_t kBlock = 4096;

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous(t.detach()); }

void check_inputs(const OpCall& c) {
  const Tensor& a = c.inputs[0];
  for (size_t i = 1; i < c.inputs.size(); ++i)
    DTR_CHECK(c.inputs[i].sizes() == a.sizes() && c.inputs[i].dtype() == a.dtype(), c.name(), ": input ", i, " ",
              c.inputs[i].sizes(), " ", c.inputs[i].dtype(), " differs from input 0 ", a.sizes(), " ", a.dtype());
}

/// Calls f(off, len) for every block of [0, n), in parallel when n is large.
template <class F>
void for_blocks(int64_t n, F f) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= cpu::kParallelGrain)
  for (int64_t b = 0; b < nb; ++b) f(b * kBlock, std::min(kBlock, n - b * kBlock));
}

std::vector<Tensor> k_swiglu(const OpCall& c) {
  check_inputs(c);
  const Tensor gate = contig(c.inputs[0]), up = contig(c.inputs[1]);
  Tensor out = empty(gate.sizes(), TensorOptions(gate.dtype()));
  const int64_t n = gate.numel();
  cpu::dispatch_floating(gate.dtype(), "swiglu", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(gate.data_ptr());
    const T* pu = static_cast<const T*>(up.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    for_blocks(n, [&](int64_t off, int64_t len) {
      if constexpr (std::is_same_v<T, float>) {
        const cpu::vec::CMapF x(px + off, len), u(pu + off, len);
        cpu::vec::MapF(po + off, len) = x / (1.0f + (-x).exp()) * u;
      } else {
        for (int64_t i = off; i < off + len; ++i) po[i] = px[i] / (T(1) + std::exp(-px[i])) * pu[i];
      }
    });
  });
  return {out};
}

std::vector<Tensor> k_swiglu_backward(const OpCall& c) {
  check_inputs(c);
  const Tensor g = contig(c.inputs[0]), gate = contig(c.inputs[1]), up = contig(c.inputs[2]);
  Tensor dgate = empty(gate.sizes(), TensorOptions(gate.dtype()));
  Tensor dup = empty(gate.sizes(), TensorOptions(gate.dtype()));
  const int64_t n = gate.numel();
  cpu::dispatch_floating(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const T* px = static_cast<const T*>(gate.data_ptr());
    const T* pu = static_cast<const T*>(up.data_ptr());
    T* pdx = static_cast<T*>(dgate.data_ptr());
    T* pdu = static_cast<T*>(dup.data_ptr());
    for_blocks(n, [&](int64_t off, int64_t len) {
      if constexpr (std::is_same_v<T, float>) {
        const cpu::vec::CMapF gv(pg + off, len), x(px + off, len), u(pu + off, len);
        const cpu::vec::ArrF s = 1.0f / (1.0f + (-x).exp());
        cpu::vec::MapF(pdu + off, len) = gv * (x * s);
        cpu::vec::MapF(pdx + off, len) = gv * u * (s * (x * (1.0f - s) + 1.0f));
      } else {
        for (int64_t i = off; i < off + len; ++i) {
          const T x = px[i], s = T(1) / (T(1) + std::exp(-x));
          pdu[i] = pg[i] * (x * s);
          pdx[i] = pg[i] * pu[i] * (s * (x * (T(1) - s) + T(1)));
        }
      }
    });
  });
  return {dgate, dup};
}

DTR_REGISTER_KERNEL("swiglu", DeviceType::CPU, k_swiglu);
DTR_REGISTER_KERNEL("swiglu_backward", DeviceType::CPU, k_swiglu_backward);

}  // namespace
}  // namespace dtr
