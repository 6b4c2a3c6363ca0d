// grouped_mm: one GEMM per group of rows, the expert product of a mixture-of-experts layer
// (tokens sorted by expert, a variable number per expert, zero allowed). Two forms, as
// torch._grouped_mm with offsets:
//   2-d x 3-d: a [T, K], b [G, K, N]  -> [T, N]     rows of group g times b[g]
//   2-d x 2-d: a [K, T], b [T, N]     -> [G, K, N]  the group's columns of a times its rows of b
// (the second form is the weight gradient of the first). Backward stays within the two forms
// (both products of one backward in one op, "grouped_mm_pair", when both are needed and no graph
// of the backward is recorded):
//   out = a @ b[g] (2x3):  da = grouped_mm(g, b^T) (2x3), db = grouped_mm(a^T, g) (2x2)
//                          (or grouped_mm(g^T, a)^T when b is a transposed view);
//   out[g] = a_g @ b_g (2x2): da = grouped_mm(b, g^T)^T (2x3), db = grouped_mm(a^T, g) (2x3).
// Group sizes are an attribute (host values: the kernel needs them, and they key the DTensor
// cache). Source: PyTorch torch._grouped_mm (offs = cumulative group sizes); Megatron-LM /
// torchtitan GroupedExperts.
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/grouped_mm.h"
#include "tensor/ops/shape.h"

namespace dtr {
namespace {
/// True when every group of the 3-d b is column-major (b = w.transpose(1, 2) of a contiguous w).
bool column_major(const Tensor& b) { return b.stride(1) == 1 && b.size(1) > 1 && b.size(2) > 1; }
}  // namespace

void check_grouped_mm(const Tensor& a, const Tensor& b, const Shape& group_sizes) {
  DTR_CHECK(a.dim() == 2 && (b.dim() == 3 || b.dim() == 2), "grouped_mm: expected a 2-d and b 3-d ([T, K] x [G, K, N]) ",
            "or both 2-d ([K, T] x [T, N]), got ", a.sizes(), " and ", b.sizes());
  check_same_dtype(a, b, "grouped_mm");
  DTR_CHECK(is_floating(a.dtype()), "grouped_mm: expected floating operands, got ", a.dtype());
  int64_t total = 0;
  for (int64_t s : group_sizes) {
    DTR_CHECK(s >= 0, "grouped_mm: negative group size in ", group_sizes);
    total += s;
  }
  const bool three = b.dim() == 3;
  if (three) {
    DTR_CHECK(b.size(0) == static_cast<int64_t>(group_sizes.size()), "grouped_mm: b ", b.sizes(), " has ", b.size(0),
              " groups but ", group_sizes.size(), " group sizes were given");
    DTR_CHECK(a.size(1) == b.size(1), "grouped_mm: inner dims differ: a ", a.sizes(), " vs b ", b.sizes(),
              " (expected [T, K] x [G, K, N])");
    DTR_CHECK(total == a.size(0), "grouped_mm: group sizes ", group_sizes, " sum to ", total, " but a ", a.sizes(),
              " has ", a.size(0), " rows");
  } else {
    DTR_CHECK(a.size(1) == b.size(0), "grouped_mm: inner dims differ: a ", a.sizes(), " vs b ", b.sizes(),
              " (expected [K, T] x [T, N])");
    DTR_CHECK(total == a.size(1), "grouped_mm: group sizes ", group_sizes, " sum to ", total, " but the shared dim of a ",
              a.sizes(), " and b ", b.sizes(), " is ", a.size(1));
  }
}

Tensor grouped_mm_with_grad(const Tensor& a, const Tensor& b, const Shape& group_sizes, Tensor out) {
  const bool three = b.dim() == 3;
  if (needs_grad({a, b}))
    record("grouped_mm", {a, b}, out,
           [sa = SavedTensor(a), sb = SavedTensor(b), group_sizes, three](const std::vector<Tensor>& g,
                                                                           const std::vector<bool>& n) {
             const Tensor ta = sa.get("grouped_mm"), tb = sb.get("grouped_mm");
             Tensor da, db;
             if (n[0] && n[1] && !grad_enabled()) {
               // Both products in one op (one parallel region on CPU); the same operands as below.
               static const OpDef* pair = op_def("grouped_mm_pair");
               const bool col = three && column_major(tb);
               const std::vector<Tensor> d =
                   three ? dispatch(OpCall{pair, {g[0], tb.transpose(1, 2), col ? g[0].t() : ta.t(), col ? ta : g[0]},
                                           {group_sizes}})
                         : dispatch(OpCall{pair, {tb, g[0].transpose(1, 2), ta.t(), g[0]}, {group_sizes}});
               da = three ? d[0] : d[0].t();
               db = col ? d[1].transpose(1, 2) : d[1];
             } else if (three) {
               if (n[0]) da = grouped_mm(g[0], tb.transpose(1, 2), group_sizes);
               // A weight stored [G, N, K] and used as b = w.transpose(1, 2) gets its gradient
               // formed transposed, so it arrives contiguous in w's layout (as mm's backward).
               if (n[1])
                 db = column_major(tb) ? grouped_mm(g[0].t(), ta, group_sizes).transpose(1, 2)
                                       : grouped_mm(ta.t(), g[0], group_sizes);
             } else {
               if (n[0]) da = grouped_mm(tb, g[0].transpose(1, 2), group_sizes).t();
               if (n[1]) db = grouped_mm(ta.t(), g[0], group_sizes);
             }
             return std::vector<Tensor>{da, db};
           });
  return out;
}

Tensor grouped_mm(const Tensor& a, const Tensor& b, const Shape& group_sizes) {
  check_grouped_mm(a, b, group_sizes);
  static const OpDef* op = op_def("grouped_mm");
  return grouped_mm_with_grad(a, b, group_sizes, dispatch1(OpCall{op, {a, b}, {group_sizes}}));
}

}  // namespace dtr
