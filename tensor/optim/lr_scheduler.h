#pragma once
// Learning-rate schedules. lr_at(step) is a pure function of the step; step() advances the
// count and sets the optimizer's learning rate (all groups). Source: NeMo / Megatron-LM
// OptimizerParamScheduler (warmup + cosine / linear decay to min_lr).
#include <cstdint>
#include <string>

#include "tensor/optim/optimizer.h"

namespace dtr::optim {

class LRScheduler {
 public:
  /// Sets the optimizer's lr to lr_at(0) (like torch schedulers at construction).
  explicit LRScheduler(Optimizer& opt) : opt_(opt) {}
  virtual ~LRScheduler() = default;
  virtual std::string type_name() const = 0;
  /// The learning rate after `step` optimizer steps.
  virtual double lr_at(int64_t step) const = 0;
  /// Advances one step and applies lr_at(new step).
  void step();
  /// Jumps to `step` (resume from a checkpoint) and applies its lr.
  void set_step(int64_t step);
  int64_t last_step() const { return step_; }
  double last_lr() const { return lr_at(step_); }

 protected:
  /// Derived constructors call this once their fields are set.
  void init() { set_step(0); }

 private:
  Optimizer& opt_;
  int64_t step_ = 0;
};

/// lr = max_lr always.
class ConstantLR : public LRScheduler {
 public:
  ConstantLR(Optimizer& opt, double max_lr);
  std::string type_name() const override { return "ConstantLR"; }
  double lr_at(int64_t step) const override;

 private:
  double max_lr_;
};

/// Linear warmup from init_lr, then cosine decay to min_lr (NeMo / Megatron "cosine"):
///   step <  warmup:       init_lr + (max_lr - init_lr) * step / warmup
///                         (Automodel's default init_lr = 0.1 max_lr: the first step is not at 0)
///   step <= decay_steps:  min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(pi * (step - warmup) / (decay_steps - warmup)))
///   step >  decay_steps:  min_lr
/// Errors: warmup < 0, decay_steps < warmup, min_lr > max_lr, init_lr > max_lr, negative rates.
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& opt, double max_lr, double min_lr, int64_t warmup_steps, int64_t decay_steps,
                 double init_lr = 0.0);
  std::string type_name() const override { return "WarmupCosineLR"; }
  double lr_at(int64_t step) const override;

 private:
  double max_lr_, min_lr_, init_lr_;
  int64_t warmup_, decay_;
};

/// Linear warmup from init_lr, then linear decay from max_lr to min_lr at decay_steps (NeMo /
/// Megatron "linear"); min_lr after. min_lr = max_lr gives Megatron's "constant" after warmup.
/// Same errors as WarmupCosineLR.
class WarmupLinearLR : public LRScheduler {
 public:
  WarmupLinearLR(Optimizer& opt, double max_lr, double min_lr, int64_t warmup_steps, int64_t decay_steps,
                 double init_lr = 0.0);
  std::string type_name() const override { return "WarmupLinearLR"; }
  double lr_at(int64_t step) const override;

 private:
  double max_lr_, min_lr_, init_lr_;
  int64_t warmup_, decay_;
};

}  // namespace dtr::optim
