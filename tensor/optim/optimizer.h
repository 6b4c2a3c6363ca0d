#pragma once
// Optimizer base: parameter groups, per-parameter state, zero_grad, learning rate.
// Source: torch.optim.Optimizer.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/tensor.h"

namespace dtr::optim {

/// A group of parameters sharing hyperparameters. lr / weight_decay left unset take the
/// optimizer's defaults at construction (like a torch param-group dict without those keys).
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

/// State of one parameter: the number of steps taken and named tensors on the parameter's
/// local storage ("exp_avg", "momentum_buffer", ...).
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> tensors;
};

class Optimizer {
 public:
  /// Errors: an undefined parameter; a parameter in two groups; no parameters at all.
  Optimizer(std::vector<ParamGroup> groups, double lr, double weight_decay);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string type_name() const = 0;
  /// One update of every parameter whose .grad is defined (others are skipped).
  virtual void step() = 0;
  /// Clears gradients: set_to_none drops them (PyTorch's default), else fills them with 0.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  /// Learning rate of group 0.
  double lr() const { return *groups_.at(0).lr; }
  /// Sets the learning rate of every group (what an LR scheduler does).
  void set_lr(double lr);
  /// State of parameter `p` (created empty on first use).
  ParamState& state(const Tensor& p) { return state_[p.impl()]; }
  bool has_state(const Tensor& p) const { return state_.count(p.impl()) != 0; }

 protected:
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
};

}  // namespace dtr::optim
