// SwiGLU gating of a gated MLP (Llama's gate/up projections) as one fused op:
//   out   = silu(gate) * up,                      silu(x) = x * s(x),  s = sigmoid
//   dup   = g * silu(gate)
//   dgate = g * up * s(gate) * (1 + gate * (1 - s(gate)))
// Forward one pass over gate/up instead of two (silu, mul); backward one fused op
// "swiglu_backward" {g, gate, up} -> {dgate, dup} instead of mul, mul, silu_backward. The backward
// dispatches that op directly (not a composition), so distributed tensors need its sharding rule
// (dtensor/rules/pointwise.cpp). Source: Shazeer 2020, "GLU Variants Improve Transformer";
// PyTorch F.silu (and its derivative silu_backward).
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  DTR_CHECK(gate.sizes() == up.sizes(), "swiglu: gate ", gate.sizes(), " and up ", up.sizes(),
            " must have the same shape (no broadcasting)");
  DTR_CHECK(gate.dtype() == up.dtype(), "swiglu: dtype mismatch: gate ", gate.dtype(), ", up ", up.dtype());
  DTR_CHECK(is_floating(gate.dtype()), "swiglu: gate/up must be floating, got ", gate.dtype());
  static const OpDef* op = op_def("swiglu");
  Tensor out = dispatch1(OpCall{op, {gate, up}, {}});
  if (needs_grad({gate, up})) {
    record("swiglu", {gate, up}, out,
           [sg = SavedTensor(gate), su = SavedTensor(up)](const std::vector<Tensor>& g, const std::vector<bool>& n) {
             static const OpDef* bw = op_def("swiglu_backward");
             std::vector<Tensor> d = dispatch(OpCall{bw, {g[0], sg.get("swiglu"), su.get("swiglu")}, {}});
             return std::vector<Tensor>{n[0] ? d[0] : Tensor(), n[1] ? d[1] : Tensor()};
           });
  }
  return out;
}

}  // namespace dtr
