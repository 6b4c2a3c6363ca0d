// Reductions and their backward formulas.
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/shape.h"

namespace dtr {
namespace {
using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

/// g reshaped to x's rank (size-1 at reduced dims) so it broadcasts back over x.
Tensor unsqueeze_reduced(const Tensor& g, const Shape& in, const Shape& dims, bool keepdim) {
  if (keepdim) return g;
  return reshape(g, reduced_shape(in, dims, true));
}
}  // namespace

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  static const OpDef* op = op_def("sum");
  Tensor out = dispatch1(OpCall{op, {x}, {dims, keepdim}});
  if (needs_grad({x})) {
    const Shape rd = reduction_dims(dims, x.dim(), "sum");
    record("sum", {x}, out, [in = x.sizes(), rd, keepdim](const Grads& g, const Needs&) {
      return Grads{expand(unsqueeze_reduced(g[0], in, rd, keepdim), in)};
    });
  }
  return out;
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  const Shape rd = reduction_dims(dims, x.dim(), "mean");
  DTR_CHECK(is_floating(x.dtype()), "mean: expected a floating tensor, got ", x.dtype());
  int64_t count = 1;
  for (int64_t d : rd) count *= x.sizes()[d];
  return div(sum(x, dims, keepdim), static_cast<double>(count));
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  static const OpDef* op = op_def("amax");
  Tensor out = dispatch1(OpCall{op, {x}, {dims, keepdim}});
  if (needs_grad({x})) {
    const Shape rd = reduction_dims(dims, x.dim(), "amax");
    record("amax", {x}, out,
           [sx = SavedTensor(x), so = SavedTensor(out.detach()), rd, keepdim](const Grads& g, const Needs&) {
             // Gradient split evenly among tied maxima (PyTorch's amax rule).
             Tensor xx = sx.get("amax");
             Tensor m = expand(unsqueeze_reduced(so.get("amax"), xx.sizes(), rd, keepdim), xx.sizes());
             Tensor mask = to_dtype(eq(xx, m), xx.dtype());
             Tensor count = sum(mask, rd, true);
             Tensor gg = unsqueeze_reduced(g[0], xx.sizes(), rd, keepdim);
             return Grads{mul(mask, div(gg, count))};
           });
  }
  return out;
}

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  static const OpDef* op = op_def("max_dim");
  std::vector<Tensor> outs = dispatch(OpCall{op, {x}, {dim, keepdim}});
  if (needs_grad({x})) {
    const int64_t d = wrap_dim(dim, x.dim(), "max");
    record("max_dim", {x}, outs, [in = x.sizes(), d, keepdim, idx = outs[1]](const Grads& g, const Needs&) {
      static const OpDef* bw = op_def("max_dim_backward");
      if (!g[0].defined()) return Grads{Tensor()};
      Tensor gg = keepdim ? g[0] : unsqueeze(g[0], d);
      Tensor ii = keepdim ? idx : unsqueeze(idx, d);
      return Grads{dispatch1(OpCall{bw, {gg, ii}, {in, d}})};
    });
  }
  return {outs[0], outs[1]};
}

Tensor all(const Tensor& x, const Shape& dims, bool keepdim) {
  static const OpDef* op = op_def("all");
  return dispatch1(OpCall{op, {x}, {dims, keepdim}});
}

Tensor any(const Tensor& x, const Shape& dims, bool keepdim) {
  static const OpDef* op = op_def("any");
  return dispatch1(OpCall{op, {x}, {dims, keepdim}});
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  static const OpDef* op = op_def("max_dim");
  return dispatch(OpCall{op, {x}, {dim, keepdim}})[1];
}

}  // namespace dtr
