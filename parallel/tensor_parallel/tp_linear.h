#pragma once
// TPLinear: a Linear whose forward takes a 3-d distributed input sharded on dim 0 or 1
// (batch or sequence parallel) through bmm with the weight expanded over the batch, so no view
// of a sharded dim is needed; any other input takes the plain linear path. Both paths give the
// same result, forward and backward. Source: NeMo Automodel shared/tp_linear.py.
#include "tensor/nn/linear.h"

namespace dtr {

class TPLinear : public nn::Linear {
 public:
  using nn::Linear::Linear;
  /// A TPLinear sharing `base`'s weight and bias tensors.
  static std::shared_ptr<TPLinear> from_linear(const nn::Linear& base);
  std::string type_name() const override { return "TPLinear"; }
  Tensor forward(const Tensor& x) override;
  /// True when forward(x) takes the bmm path.
  static bool needs_bmm(const Tensor& x);
};

}  // namespace dtr
