// CUDA kernel of grouped_mm (see ops/grouped_mm.cpp): one cuBLASLt GEMM per non-empty group
// (cuda::gemm on views of the operands, transposed views without copies), each result copied
// into its rows of the output (2x3) or its [K, N] block (2x2); empty groups give zeros. A fused
// grouped kernel (one launch for all groups, device-side offsets) is not built: this path costs
// one launch and one copy per group, which is what a mixture-of-experts layer with few large
// groups can afford.
#include "tensor/cuda/cuda_context.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda/copy.h"
#include "tensor/ops/cuda/gemm.h"

namespace dtr {
namespace {

std::vector<Tensor> k_grouped_mm(const OpCall& c) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  const Shape& sizes = c.shape(0);
  const int64_t G = static_cast<int64_t>(sizes.size());
  cuda::DeviceGuard guard(a.device().index);
  const TensorOptions opt = TensorOptions(a.dtype()).with_device(a.device());
  Tensor out;
  int64_t off = 0;
  if (b.dim() == 3) {  // a [T, K] x b [G, K, N] -> [T, N]
    out = empty({a.size(0), b.size(2)}, opt);
    for (int64_t g = 0; g < G; ++g) {
      if (sizes[g] == 0) continue;
      const Tensor y = cuda::gemm(a.narrow(0, off, sizes[g]), b.narrow(0, g, 1).squeeze(0));
      Tensor dst = out.narrow(0, off, sizes[g]);
      cuda::copy_strided(dst, y);
      off += sizes[g];
    }
  } else {  // a [K, T] x b [T, N] -> [G, K, N]
    out = empty({G, a.size(0), b.size(1)}, opt);
    for (int64_t g = 0; g < G; ++g) {
      Tensor dst = out.narrow(0, g, 1).squeeze(0);
      if (sizes[g] == 0) {
        cuda::fill_strided(dst, 0.0);
        continue;
      }
      cuda::copy_strided(dst, cuda::gemm(a.narrow(1, off, sizes[g]), b.narrow(0, off, sizes[g])));
      off += sizes[g];
    }
  }
  return {out};
}

/// {a1, b1, a2, b2} attrs {sizes} -> both products (a grouped_mm backward's dA and dB; the CPU
/// kernel runs them in one parallel region, here they are two calls on the stream).
std::vector<Tensor> k_grouped_mm_pair(const OpCall& c) {
  const Tensor d0 = k_grouped_mm(OpCall{c.op, {c.inputs[0], c.inputs[1]}, c.attrs}).at(0);
  return {d0, k_grouped_mm(OpCall{c.op, {c.inputs[2], c.inputs[3]}, c.attrs}).at(0)};
}

/// {x, w, weights} attrs {sizes} -> {gate_up = grouped_mm(x, w), swiglu_weighted(gate_up, weights)}
/// (the CPU kernel fuses the SwiGLU into each GEMM piece; here the two kernels in turn).
std::vector<Tensor> k_grouped_mm_swiglu(const OpCall& c) {
  const Tensor gu = k_grouped_mm(OpCall{c.op, {c.inputs[0], c.inputs[1]}, c.attrs}).at(0);
  static const OpDef* sw = op_def("swiglu_weighted");
  return {gu, dispatch1(OpCall{sw, {gu, c.inputs[2]}, {}})};
}

DTR_REGISTER_KERNEL("grouped_mm", DeviceType::CUDA, k_grouped_mm);
DTR_REGISTER_KERNEL("grouped_mm_swiglu", DeviceType::CUDA, k_grouped_mm_swiglu);
DTR_REGISTER_KERNEL("grouped_mm_pair", DeviceType::CUDA, k_grouped_mm_pair);

}  // namespace
}  // namespace dtr
