// Matrix products: mm, bmm, addmm_ (kernels), matmul and linear (composed from views + mm/bmm).
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/shape.h"

namespace dtr {
namespace {
using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

/// True when the 2-d tensor t is column-major (a transposed view of a contiguous matrix, e.g.
/// linear's w.t()) rather than row-major.
bool column_major(const Tensor& t) { return t.stride(0) == 1 && t.size(1) > 1 && t.size(0) > 1; }

/// Gradients of mm's operands in the operand's own memory layout (PyTorch's mm_mat1_backward /
/// mm_mat2_backward): for a column-major operand the product is formed transposed, so that the
/// gradient of a weight used as w.t() arrives contiguous once the view's backward transposes
/// it back (no copy before the optimizer or the FSDP reduce-scatter).
Tensor mm_mat1_backward(const Tensor& g, const Tensor& a, const Tensor& b) {
  return column_major(a) ? mm(b, g.t()).t() : mm(g, b.t());
}
Tensor mm_mat2_backward(const Tensor& g, const Tensor& a, const Tensor& b) {
  return column_major(b) ? mm(g.t(), a).t() : mm(a.t(), g);
}
}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  DTR_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-d operands, got ", a.sizes(), " and ", b.sizes());
  DTR_CHECK(a.size(1) == b.size(0), "mm: inner dims differ: a ", a.sizes(), " vs b ", b.sizes());
  check_same_dtype(a, b, "mm");
  static const OpDef* op = op_def("mm");
  Tensor out = dispatch1(OpCall{op, {a, b}, {}});
  if (needs_grad({a, b}))
    record("mm", {a, b}, out, [sa = SavedTensor(a), sb = SavedTensor(b)](const Grads& g, const Needs& n) {
      const Tensor ta = sa.get("mm");
      const Tensor tb = sb.get("mm");
      return Grads{n[0] ? mm_mat1_backward(g[0], ta, tb) : Tensor(), n[1] ? mm_mat2_backward(g[0], ta, tb) : Tensor()};
    });
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  DTR_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-d operands, got ", a.sizes(), " and ", b.sizes());
  DTR_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "bmm: shapes ", a.sizes(), " and ", b.sizes(),
            " do not match ([b, m, k] x [b, k, n])");
  check_same_dtype(a, b, "bmm");
  static const OpDef* op = op_def("bmm");
  Tensor out = dispatch1(OpCall{op, {a, b}, {}});
  if (needs_grad({a, b}))
    record("bmm", {a, b}, out, [sa = SavedTensor(a), sb = SavedTensor(b)](const Grads& g, const Needs& n) {
      return Grads{n[0] ? bmm(g[0], sb.get("bmm").transpose(1, 2)) : Tensor(),
                   n[1] ? bmm(sa.get("bmm").transpose(1, 2), g[0]) : Tensor()};
    });
  return out;
}

Tensor& addmm_(Tensor& self, const Tensor& a, const Tensor& b) {
  DTR_CHECK(self.dim() == 2 && a.dim() == 2 && b.dim() == 2, "addmm_: expected 2-d self, a and b, got ", self.sizes(),
            ", ", a.sizes(), " and ", b.sizes());
  DTR_CHECK(a.size(1) == b.size(0) && self.size(0) == a.size(0) && self.size(1) == b.size(1), "addmm_: shapes ",
            self.sizes(), " += ", a.sizes(), " x ", b.sizes(), " do not match ([m, n] += [m, k] x [k, n])");
  check_same_dtype(self, a, "addmm_");
  check_same_dtype(a, b, "addmm_");
  check_inplace(self, "addmm_");
  DTR_CHECK(!(grad_enabled() && (a.requires_grad() || b.requires_grad())),
            "addmm_: records no autograd; an operand requires grad (run it under NoGradGuard)");
  DTR_CHECK(self.is_distributed() || (self.storage() != a.storage() && self.storage() != b.storage()),
            "addmm_: self shares storage with an operand");
  static const OpDef* op = op_def("addmm_");
  dispatch(OpCall{op, {self, a, b}, {}});
  self.bump_version();
  return self;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  DTR_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: 0-d operand (shapes ", a.sizes(), " and ", b.sizes(), ")");
  if (a.dim() == 1 && b.dim() == 1) {
    DTR_CHECK(a.size(0) == b.size(0), "matmul: vector sizes differ: ", a.sizes(), " vs ", b.sizes());
    return sum(mul(a, b));
  }
  // Check here so the message names matmul and the caller's shapes (not an inner mm's).
  DTR_CHECK(a.size(-1) == b.size(b.dim() == 1 ? 0 : -2), "matmul: inner dims differ: a ", a.sizes(), " vs b ",
            b.sizes());
  if (a.dim() == 2 && b.dim() == 2) return mm(a, b);
  if (a.dim() == 1) return squeeze(matmul(unsqueeze(a, 0), b), -2);
  if (b.dim() == 1) return squeeze(matmul(a, unsqueeze(b, 1)), -1);
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  DTR_CHECK(b.size(-2) == k, "matmul: inner dims differ: a ", a.sizes(), " vs b ", b.sizes());
  if (b.dim() == 2) {  // [..., m, k] x [k, n]: one big mm
    Shape out = a.sizes();
    out.back() = n;
    return reshape(mm(reshape(a, {-1, k}), b), out);
  }
  Shape ba(a.sizes().begin(), a.sizes().end() - 2), bb(b.sizes().begin(), b.sizes().end() - 2);
  Shape batch = broadcast_shapes(ba, bb, "matmul");
  Shape ea = batch, eb = batch, out = batch;
  ea.insert(ea.end(), {m, k});
  eb.insert(eb.end(), {k, n});
  out.insert(out.end(), {m, n});
  const int64_t B = shape_numel(batch);
  return reshape(bmm(reshape(expand(a, ea), {B, m, k}), reshape(expand(b, eb), {B, k, n})), out);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  DTR_CHECK(w.dim() == 2, "linear: weight must be 2-d [out, in], got ", w.sizes());
  DTR_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input ", x.sizes(), " does not match weight ", w.sizes(),
            " (expected input [..., ", w.size(1), "])");
  DTR_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w.size(0)), "linear: bias ", bias.sizes(),
            " does not match weight ", w.sizes());
  Shape out_shape = x.sizes();
  out_shape.back() = w.size(0);
  Tensor y = mm(x.dim() == 2 ? x : reshape(x, {-1, w.size(1)}), w.t());
  if (bias.defined()) y = add(y, bias);
  return x.dim() == 2 ? y : reshape(y, out_shape);
}

}  // namespace dtr
