// Inverted dropout. Element i (row-major index in the global tensor) is kept when
// philox_uniform(seed, offset + i) >= p and then scaled by 1 / (1 - p). seed and offset are op
// attributes, so a shard of a distributed tensor can regenerate exactly its slice of the mask,
// and backward recomputes the mask instead of storing it (backward = the same op on g).
// Source: Srivastava et al. 2014; torch.nn.functional.dropout.
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr {

Tensor dropout(const Tensor& x, double p, bool training) {
  DTR_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got ", p);
  DTR_CHECK(is_floating(x.dtype()), "dropout: expected a floating tensor, got ", x.dtype());
  if (!training || p == 0.0) return x;
  if (p == 1.0) return mul(x, 0.0);
  const int64_t seed = static_cast<int64_t>(generator_state().seed);
  const int64_t offset = static_cast<int64_t>(reserve_random_offsets(static_cast<uint64_t>(x.numel())));
  static const OpDef* op = op_def("dropout");
  Tensor out = dispatch1(OpCall{op, {x}, {p, seed, offset}});
  if (needs_grad({x})) {
    record("dropout", {x}, out, [p, seed, offset](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{dispatch1(OpCall{op_def("dropout"), {g[0]}, {p, seed, offset}})};
    });
  }
  return out;
}

}  // namespace dtr
