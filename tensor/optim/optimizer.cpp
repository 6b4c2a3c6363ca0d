// Optimizer base (see optimizer.h).
#include "tensor/optim/optimizer.h"

#include <unordered_set>

#include "tensor/autograd/grad_mode.h"

namespace dtr::optim {

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay) : groups_(std::move(groups)) {
  DTR_CHECK(lr >= 0.0, "optimizer: invalid learning rate ", lr);
  DTR_CHECK(weight_decay >= 0.0, "optimizer: invalid weight_decay ", weight_decay);
  std::unordered_set<const TensorImpl*> seen;
  size_t count = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    ParamGroup& g = groups_[gi];
    if (!g.lr) g.lr = lr;
    if (!g.weight_decay) g.weight_decay = weight_decay;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const Tensor& p = g.params[i];
      DTR_CHECK(p.defined(), "optimizer: parameter ", i, " of group ", gi, " is undefined");
      DTR_CHECK(is_floating(p.dtype()), "optimizer: parameter ", i, " of group ", gi, " has dtype ", p.dtype(),
                ", expected a floating dtype");
      DTR_CHECK(seen.insert(p.impl()).second, "optimizer: parameter ", i, " of group ", gi, " (shape ", p.sizes(),
                ") appears in more than one group");
      ++count;
    }
  }
  DTR_CHECK(count > 0, "optimizer: got an empty parameter list");
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (auto& g : groups_)
    for (auto& p : g.params) {
      Tensor gr = p.grad();
      if (!gr.defined()) continue;
      if (set_to_none) p.set_grad(Tensor());
      else gr.zero_();
    }
}

void Optimizer::set_lr(double lr) {
  DTR_CHECK(lr >= 0.0, "optimizer: invalid learning rate ", lr);
  for (auto& g : groups_) g.lr = lr;
}

}  // namespace dtr::optim
