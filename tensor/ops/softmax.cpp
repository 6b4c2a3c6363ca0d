// softmax / log_softmax over any dim: fused, numerically stable kernels (max-subtracted
// exponentials) and fused backward kernels.
//   softmax:     dx = y * (g - sum(g * y))
//   log_softmax: dx = g - exp(y) * sum(g)
// Source: PyTorch's _softmax / _log_softmax and their _backward_data ops.
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {
namespace {
using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

Tensor softmax_impl(const char* name, const char* bw_name, const Tensor& x, int64_t dim) {
  DTR_CHECK(is_floating(x.dtype()), name, ": expected a floating tensor, got ", x.dtype(), " of shape ", x.sizes());
  const int64_t d = wrap_dim(dim, std::max<int64_t>(x.dim(), 1), name);
  Tensor out = dispatch1(OpCall{op_def(name), {x}, {d}});
  if (needs_grad({x})) {
    record(name, {x}, out, [bw_name, name, d, so = SavedTensor(out.detach())](const Grads& g, const Needs&) {
      return Grads{dispatch1(OpCall{op_def(bw_name), {g[0], so.get(name)}, {d}})};
    });
  }
  return out;
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl("softmax", "softmax_backward", x, dim); }

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_impl("log_softmax", "log_softmax_backward", x, dim);
}

}  // namespace dtr
