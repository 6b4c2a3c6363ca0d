// Pointwise ops with broadcasting and their backward formulas.
#include <cmath>

#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

Tensor call(const char* name, std::vector<Tensor> in, std::vector<Attr> attrs = {}) {
  return dispatch1(OpCall{op_def(name), std::move(in), std::move(attrs)});
}

/// Unary op whose gradient is g * dfn(x, out).
template <class D>
Tensor unary_op(const char* name, const Tensor& x, D dfn, std::vector<Attr> attrs = {}) {
  Tensor out = call(name, {x}, attrs);
  if (needs_grad({x})) {
    record(name, {x}, out,
           [name, sx = SavedTensor(x), so = SavedTensor(out.detach()), dfn](const Grads& g, const Needs&) {
             return Grads{dfn(g[0], sx.get(name), so.get(name))};
           });
  }
  return out;
}

Tensor zeros_scalar_like(const Tensor& t) { return zeros({}, TensorOptions(t.dtype()).with_device(t.device())); }

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = call("add", {a, b});
  if (needs_grad({a, b}))
    record("add", {a, b}, out, [sa = a.sizes(), sb = b.sizes()](const Grads& g, const Needs& n) {
      return Grads{n[0] ? sum_to(g[0], sa) : Tensor(), n[1] ? sum_to(g[0], sb) : Tensor()};
    });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = call("sub", {a, b});
  if (needs_grad({a, b}))
    record("sub", {a, b}, out, [sa = a.sizes(), sb = b.sizes()](const Grads& g, const Needs& n) {
      return Grads{n[0] ? sum_to(g[0], sa) : Tensor(), n[1] ? sum_to(neg(g[0]), sb) : Tensor()};
    });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = call("mul", {a, b});
  if (needs_grad({a, b}))
    record("mul", {a, b}, out, [sa = SavedTensor(a), sb = SavedTensor(b)](const Grads& g, const Needs& n) {
      return Grads{n[0] ? sum_to(mul(g[0], sb.get("mul")), sa.sizes()) : Tensor(),
                   n[1] ? sum_to(mul(g[0], sa.get("mul")), sb.sizes()) : Tensor()};
    });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = call("div", {a, b});
  if (needs_grad({a, b}))
    record("div", {a, b}, out, [sa = SavedTensor(a), sb = SavedTensor(b)](const Grads& g, const Needs& n) {
      Tensor bb = sb.get("div");
      return Grads{n[0] ? sum_to(div(g[0], bb), sa.sizes()) : Tensor(),
                   n[1] ? sum_to(neg(div(mul(g[0], sa.get("div")), mul(bb, bb))), sb.sizes()) : Tensor()};
    });
  return out;
}

Tensor add(const Tensor& a, double s) {
  Tensor out = call("add_scalar", {a}, {s});
  if (needs_grad({a})) record("add_scalar", {a}, out, [](const Grads& g, const Needs&) { return Grads{g[0]}; });
  return out;
}

Tensor sub(const Tensor& a, double s) {
  Tensor out = call("sub_scalar", {a}, {s});
  if (needs_grad({a})) record("sub_scalar", {a}, out, [](const Grads& g, const Needs&) { return Grads{g[0]}; });
  return out;
}

Tensor mul(const Tensor& a, double s) {
  Tensor out = call("mul_scalar", {a}, {s});
  if (needs_grad({a})) record("mul_scalar", {a}, out, [s](const Grads& g, const Needs&) { return Grads{mul(g[0], s)}; });
  return out;
}

Tensor div(const Tensor& a, double s) {
  Tensor out = call("div_scalar", {a}, {s});
  if (needs_grad({a})) record("div_scalar", {a}, out, [s](const Grads& g, const Needs&) { return Grads{div(g[0], s)}; });
  return out;
}

Tensor rsub(const Tensor& a, double s) {
  Tensor out = call("rsub_scalar", {a}, {s});
  if (needs_grad({a})) record("rsub_scalar", {a}, out, [](const Grads& g, const Needs&) { return Grads{neg(g[0])}; });
  return out;
}

Tensor neg(const Tensor& x) {
  Tensor out = call("neg", {x});
  if (needs_grad({x})) record("neg", {x}, out, [](const Grads& g, const Needs&) { return Grads{neg(g[0])}; });
  return out;
}

Tensor exp(const Tensor& x) {
  return unary_op("exp", x, [](const Tensor& g, const Tensor&, const Tensor& y) { return mul(g, y); });
}
Tensor log(const Tensor& x) {
  return unary_op("log", x, [](const Tensor& g, const Tensor& x, const Tensor&) { return div(g, x); });
}
Tensor sqrt(const Tensor& x) {
  return unary_op("sqrt", x, [](const Tensor& g, const Tensor&, const Tensor& y) { return div(g, mul(y, 2.0)); });
}
Tensor rsqrt(const Tensor& x) {
  return unary_op("rsqrt", x, [](const Tensor& g, const Tensor&, const Tensor& y) {
    return mul(mul(g, mul(y, mul(y, y))), -0.5);
  });
}
Tensor pow(const Tensor& x, double p) {
  return unary_op(
      "pow_scalar", x, [p](const Tensor& g, const Tensor& x, const Tensor&) { return mul(mul(g, pow(x, p - 1.0)), p); },
      {p});
}
Tensor abs(const Tensor& x) {
  return unary_op("abs", x, [](const Tensor& g, const Tensor& x, const Tensor&) { return mul(g, call("sign", {x})); });
}
Tensor sigmoid(const Tensor& x) {
  return unary_op("sigmoid", x, [](const Tensor& g, const Tensor&, const Tensor& y) { return mul(g, mul(y, rsub(y, 1.0))); });
}
Tensor tanh(const Tensor& x) {
  return unary_op("tanh", x, [](const Tensor& g, const Tensor&, const Tensor& y) { return mul(g, rsub(mul(y, y), 1.0)); });
}
Tensor relu(const Tensor& x) {
  return unary_op("relu", x, [](const Tensor& g, const Tensor& x, const Tensor&) {
    return where(gt(x, 0.0), g, zeros_scalar_like(g));
  });
}
Tensor silu(const Tensor& x) {
  // d/dx x*s(x) = s * (1 + x * (1 - s))
  return unary_op("silu", x, [](const Tensor& g, const Tensor& x, const Tensor&) {
    // Local CPU f32: one fused kernel. Distributed / other devices / f64 (kept bit-exact):
    // the composed form.
    if (x.dtype() == DType::f32 && g.dtype() == DType::f32 && !x.is_distributed() && !g.is_distributed() &&
        x.device().is_cpu() && g.device().is_cpu()) {
      static const OpDef* bw = op_def("silu_backward");
      return dispatch1(OpCall{bw, {g, x}, {}});
    }
    Tensor s = sigmoid(x);
    return mul(g, mul(s, add(mul(x, rsub(s, 1.0)), 1.0)));
  });
}
Tensor gelu(const Tensor& x, bool approximate) {
  const char* name = approximate ? "gelu_tanh" : "gelu_erf";
  return unary_op(name, x, [approximate](const Tensor& g, const Tensor& x, const Tensor&) {
    return dispatch1(OpCall{op_def("gelu_backward"), {g, x}, {approximate}});
  });
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = call("where", {cond, a, b});
  if (needs_grad({a, b}))
    record("where", {cond, a, b}, out,
           [c = SavedTensor(cond), sa = a.sizes(), sb = b.sizes()](const Grads& g, const Needs& n) {
             Tensor cc = c.get("where");
             Tensor z = zeros_scalar_like(g[0]);
             return Grads{Tensor(), n[1] ? sum_to(where(cc, g[0], z), sa) : Tensor(),
                          n[2] ? sum_to(where(cc, z, g[0]), sb) : Tensor()};
           });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return where(mask, full({}, value, TensorOptions(x.dtype()).with_device(x.device())), x);
}

Tensor eq(const Tensor& a, const Tensor& b) { return call("eq", {a, b}); }
Tensor gt(const Tensor& a, double s) { return call("gt_scalar", {a}, {s}); }
Tensor lt(const Tensor& a, double s) { return call("lt_scalar", {a}, {s}); }

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = call("maximum", {a, b});
  if (needs_grad({a, b}))
    record("maximum", {a, b}, out,
           [sa = SavedTensor(a), so = SavedTensor(out.detach()), szb = b.sizes()](const Grads& g, const Needs& n) {
             Tensor take_a = eq(expand(sa.get("maximum"), so.sizes()), so.get("maximum"));
             Tensor z = zeros_scalar_like(g[0]);
             return Grads{n[0] ? sum_to(where(take_a, g[0], z), sa.sizes()) : Tensor(),
                          n[1] ? sum_to(where(take_a, z, g[0]), szb) : Tensor()};
           });
  return out;
}

}  // namespace dtr
