// rms_norm: y = x * rsqrt(mean(x^2, -1) + eps) * weight, one fused kernel forward and one
// fused backward kernel ("rms_norm_backward" -> dx, dweight). Accumulation in at least f32.
// Source: Zhang & Sennrich 2019; Hugging Face LlamaRMSNorm.
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  DTR_CHECK(x.dim() >= 1 && is_floating(x.dtype()), "rms_norm: x must be a floating tensor [..., D], got ", x.dtype(),
            " ", x.sizes());
  DTR_CHECK(weight.defined() && weight.dim() == 1 && weight.sizes()[0] == x.sizes().back(),
            "rms_norm: weight must be [D] with D = ", x.sizes().back(), " (x ", x.sizes(), "), got ",
            weight.defined() ? weight.sizes() : Shape{});
  DTR_CHECK(weight.dtype() == x.dtype(), "rms_norm: dtype mismatch: x ", x.dtype(), " vs weight ", weight.dtype());
  DTR_CHECK(eps >= 0, "rms_norm: eps must be >= 0, got ", eps);
  static const OpDef* op = op_def("rms_norm");
  Tensor out = dispatch1(OpCall{op, {x, weight}, {eps}});
  if (needs_grad({x, weight})) {
    record("rms_norm", {x, weight}, out,
           [sx = SavedTensor(x), sw = SavedTensor(weight), eps](const std::vector<Tensor>& g, const std::vector<bool>&) {
             static const OpDef* bw = op_def("rms_norm_backward");
             return dispatch(OpCall{bw, {g[0], sx.get("rms_norm"), sw.get("rms_norm")}, {eps}});
           });
  }
  return out;
}

}  // namespace dtr
