#pragma once
// nn::Dropout. Source: torch.nn.Dropout (inverted dropout).
#include "tensor/nn/module.h"

namespace dtr::nn {

/// Training: zeroes each element with probability p (Philox mask addressed by the global
/// element index) and scales the rest by 1/(1-p). Eval: identity. Errors: p outside [0, 1].
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  std::string type_name() const override { return "Dropout"; }
  Tensor forward(const Tensor& x) override;

  const double p;
};

}  // namespace dtr::nn
