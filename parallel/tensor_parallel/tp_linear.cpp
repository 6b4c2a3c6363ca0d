#include "parallel/tensor_parallel/tp_linear.h"

#include "dtensor/api.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr {

std::shared_ptr<TPLinear> TPLinear::from_linear(const nn::Linear& base) {
  // Construction draws a random init that is replaced at once: keep the generator untouched.
  const GeneratorState g = generator_state();
  auto t = std::make_shared<TPLinear>(base.in_features, base.out_features, base.bias().defined(), base.weight().dtype());
  t->register_parameter("weight", base.weight(), base.weight().requires_grad());
  if (base.bias().defined()) t->register_parameter("bias", base.bias(), base.bias().requires_grad());
  set_generator_state(g);
  return t;
}

bool TPLinear::needs_bmm(const Tensor& x) {
  if (!x.is_distributed() || x.dim() != 3) return false;
  for (const auto& p : placements(x))
    if (p.is_shard(0) || p.is_shard(1)) return true;
  return false;
}

Tensor TPLinear::forward(const Tensor& x) {
  Tensor w = weight();
  Tensor b = bias();
  if (!needs_bmm(x)) return linear(x, w, b);
  // [B, T, in] x [B, in, out] (the weight transposed, expanded over the batch).
  Tensor wt = unsqueeze(transpose(w, 0, 1), 0);
  Tensor y = bmm(x, expand(wt, {x.size(0), w.size(1), w.size(0)}));
  return b.defined() ? add(y, b) : y;
}

}  // namespace dtr
