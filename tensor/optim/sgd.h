#pragma once
// Stochastic gradient descent with momentum. Source: torch.optim.SGD (single-tensor path).
#include "tensor/optim/optimizer.h"

namespace dtr::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// Per parameter with a defined gradient:
///   d = g + wd * p
///   if momentum: buf = d at the first step, else buf = momentum * buf + (1 - dampening) * d;
///                d = nesterov ? d + momentum * buf : buf
///   p <- p - lr * d
/// One fused loop per parameter; math in f64 for f64 parameters, f32 otherwise.
/// Errors: negative lr / momentum / wd; nesterov without momentum or with dampening.
class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions opt = {});
  SGD(const std::vector<Tensor>& params, SGDOptions opt = {});
  std::string type_name() const override { return "SGD"; }
  void step() override;
  const SGDOptions& options() const { return opt_; }

 private:
  SGDOptions opt_;
};

}  // namespace dtr::optim
