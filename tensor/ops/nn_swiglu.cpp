// SwiGLU gating of a gated MLP (Llama's gate/up projections) as one fused op:
//   out   = silu(gate) * up,                      silu(x) = x * s(x),  s = sigmoid
//   dup   = g * silu(gate)
//   dgate = g * up * s(gate) * (1 + gate * (1 - s(gate)))
// Forward one pass over gate/up instead of two (silu, mul); backward one fused op
// "swiglu_backward" {g, gate, up} -> {dgate, dup} instead of mul, mul, silu_backward. The backward
// dispatches that op directly (not a composition), so distributed tensors need its sharding rule
// (dtensor/rules/pointwise.cpp). Source: Shazeer 2020, "GLU Variants Improve Transformer";
// PyTorch F.silu (and its derivative silu_backward). swiglu(gate_up) takes both halves of one
// [..., 2I] tensor (MoE experts' gate_up_proj output, the halves read in place) and returns one
// [..., 2I] gradient from one op, "swiglu_joined_backward" {g, gate_up} (no copies of the halves,
// no cat). geglu(gate, up) = gelu_tanh(gate) * up is built the same way ("geglu",
// "geglu_backward" {g, gate, up} -> {dgate, dup}): Gemma's MLP gating in two passes where
// gelu, mul and their backwards (gelu_backward, two muls) took five. swiglu_weighted(gate_up,
// weights) is the joined form with each row scaled by its weight ("swiglu_weighted",
// "swiglu_weighted_backward" {g, gate_up, weights} -> {d gate_up, d weights}). grouped_mm_swiglu
// computes a grouped_mm and the weighted SwiGLU of its rows in one op ("grouped_mm_swiglu"
// {x, w, weights} attrs {sizes} -> {gate_up, h}) and records the two ops' autograd nodes.
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/grouped_mm.h"
#include "tensor/ops/nn_swiglu.h"

namespace dtr {

namespace {

/// `name`(gate, up) with backward op `backward` {g, gate, up} -> {dgate, dup}.
Tensor fused_glu(const char* name, const char* backward, const Tensor& gate, const Tensor& up) {
  DTR_CHECK(gate.sizes() == up.sizes(), name, ": gate ", gate.sizes(), " and up ", up.sizes(),
            " must have the same shape (no broadcasting)");
  DTR_CHECK(gate.dtype() == up.dtype(), name, ": dtype mismatch: gate ", gate.dtype(), ", up ", up.dtype());
  DTR_CHECK(is_floating(gate.dtype()), name, ": gate/up must be floating, got ", gate.dtype());
  Tensor out = dispatch1(OpCall{op_def(name), {gate, up}, {}});
  if (needs_grad({gate, up})) {
    record(name, {gate, up}, out,
           [name, bw = op_def(backward), sg = SavedTensor(gate), su = SavedTensor(up)](const std::vector<Tensor>& g,
                                                                                       const std::vector<bool>& n) {
             std::vector<Tensor> d = dispatch(OpCall{bw, {g[0], sg.get(name), su.get(name)}, {}});
             return std::vector<Tensor>{n[0] ? d[0] : Tensor(), n[1] ? d[1] : Tensor()};
           });
  }
  return out;
}

}  // namespace

Tensor swiglu(const Tensor& gate, const Tensor& up) { return fused_glu("swiglu", "swiglu_backward", gate, up); }

Tensor geglu(const Tensor& gate, const Tensor& up) { return fused_glu("geglu", "geglu_backward", gate, up); }

Tensor swiglu(const Tensor& gate_up) {
  DTR_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) > 0 && gate_up.size(-1) % 2 == 0, "swiglu: gate_up ",
            gate_up.sizes(), " must have an even, non-zero last dim (gate half, then up half)");
  DTR_CHECK(is_floating(gate_up.dtype()), "swiglu: gate_up must be floating, got ", gate_up.dtype());
  const int64_t d = gate_up.dim() - 1, I = gate_up.size(-1) / 2;
  static const OpDef* op = op_def("swiglu");
  Tensor out = dispatch1(OpCall{op, {gate_up.narrow(d, 0, I), gate_up.narrow(d, I, I)}, {}});
  if (needs_grad({gate_up})) {
    record("swiglu", {gate_up}, out, [sx = SavedTensor(gate_up)](const std::vector<Tensor>& g, const std::vector<bool>&) {
      static const OpDef* bw = op_def("swiglu_joined_backward");
      return std::vector<Tensor>{dispatch1(OpCall{bw, {g[0], sx.get("swiglu")}, {}})};
    });
  }
  return out;
}

namespace {

void check_swiglu_weighted(const Tensor& gate_up, const Tensor& weights) {
  DTR_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) > 0 && gate_up.size(-1) % 2 == 0, "swiglu_weighted: gate_up ",
            gate_up.sizes(), " must have an even, non-zero last dim (gate half, then up half)");
  DTR_CHECK(is_floating(gate_up.dtype()), "swiglu_weighted: gate_up must be floating, got ", gate_up.dtype());
  DTR_CHECK(weights.dtype() == gate_up.dtype() && weights.dim() == gate_up.dim() - 1 &&
                Shape(gate_up.sizes().begin(), gate_up.sizes().end() - 1) == weights.sizes(),
            "swiglu_weighted: weights ", weights.sizes(), " ", weights.dtype(), " (expected gate_up ", gate_up.sizes(),
            "'s leading dims, ", gate_up.dtype(), ")");
}

/// `out` (the value of swiglu_weighted(gate_up, weights)) as the output of its autograd node.
Tensor swiglu_weighted_with_grad(const Tensor& gate_up, const Tensor& weights, Tensor out) {
  if (needs_grad({gate_up, weights})) {
    record("swiglu_weighted", {gate_up, weights}, out,
           [sx = SavedTensor(gate_up), sw = SavedTensor(weights)](const std::vector<Tensor>& g,
                                                                   const std::vector<bool>& n) {
             static const OpDef* bw = op_def("swiglu_weighted_backward");
             std::vector<Tensor> d =
                 dispatch(OpCall{bw, {g[0], sx.get("swiglu_weighted"), sw.get("swiglu_weighted")}, {}});
             return std::vector<Tensor>{n[0] ? d[0] : Tensor(), n[1] ? d[1] : Tensor()};
           });
  }
  return out;
}

}  // namespace

Tensor swiglu_weighted(const Tensor& gate_up, const Tensor& weights) {
  check_swiglu_weighted(gate_up, weights);
  static const OpDef* op = op_def("swiglu_weighted");
  return swiglu_weighted_with_grad(gate_up, weights, dispatch1(OpCall{op, {gate_up, weights}, {}}));
}

Tensor grouped_mm_swiglu(const Tensor& x, const Tensor& w, const Shape& group_sizes, const Tensor& weights) {
  check_grouped_mm(x, w, group_sizes);
  DTR_CHECK(w.dim() == 3 && w.size(2) > 0 && w.size(2) % 2 == 0, "grouped_mm_swiglu: w ", w.sizes(),
            " (expected [G, K, 2I], I > 0: the 2x3 form)");
  DTR_CHECK(weights.dim() == 1 && weights.size(0) == x.size(0) && weights.dtype() == x.dtype(),
            "grouped_mm_swiglu: weights ", weights.sizes(), " ", weights.dtype(), " (expected [", x.size(0), "] ",
            x.dtype(), ")");
  // bf16 / f16: the two ops, which round gate_up to the input dtype before the SwiGLU (the fused
  // kernel would run the SwiGLU on its unrounded f32 GEMM result: other bits than the two ops').
  if (is_low_precision(x.dtype())) return swiglu_weighted(grouped_mm(x, w, group_sizes), weights);
  static const OpDef* op = op_def("grouped_mm_swiglu");
  const std::vector<Tensor> r = dispatch(OpCall{op, {x, w, weights}, {group_sizes}});
  return swiglu_weighted_with_grad(grouped_mm_with_grad(x, w, group_sizes, r[0]), weights, r[1]);
}

}  // namespace dtr
