// Learning-rate schedules (see lr_scheduler.h).
#include "tensor/optim/lr_scheduler.h"

#include <cmath>

namespace dtr::optim {
namespace {

void check_schedule(const char* name, double max_lr, double min_lr, int64_t warmup, int64_t decay, double init_lr) {
  DTR_CHECK(max_lr >= 0.0 && min_lr >= 0.0 && min_lr <= max_lr, name, ": need 0 <= min_lr <= max_lr, got min_lr ",
            min_lr, ", max_lr ", max_lr);
  DTR_CHECK(init_lr >= 0.0 && init_lr <= max_lr, name, ": need 0 <= init_lr <= max_lr, got init_lr ", init_lr,
            ", max_lr ", max_lr);
  DTR_CHECK(warmup >= 0 && decay >= warmup, name, ": need 0 <= warmup_steps <= decay_steps, got warmup_steps ",
            warmup, ", decay_steps ", decay);
}

/// Fraction of the decay phase done at `step` (warmup <= step <= decay), 1 when it is empty.
double decay_ratio(int64_t step, int64_t warmup, int64_t decay) {
  if (decay == warmup) return 1.0;
  return static_cast<double>(step - warmup) / static_cast<double>(decay - warmup);
}

/// Megatron's warmup: init_lr + (max_lr - init_lr) * step / warmup.
double warmup_lr(int64_t step, int64_t warmup, double init_lr, double max_lr) {
  return init_lr + (max_lr - init_lr) * static_cast<double>(step) / static_cast<double>(warmup);
}

}  // namespace

void LRScheduler::step() { set_step(step_ + 1); }

void LRScheduler::set_step(int64_t step) {
  DTR_CHECK(step >= 0, type_name(), ": negative step ", step);
  step_ = step;
  opt_.set_lr(lr_at(step_));
}

ConstantLR::ConstantLR(Optimizer& opt, double max_lr) : LRScheduler(opt), max_lr_(max_lr) {
  DTR_CHECK(max_lr >= 0.0, "ConstantLR: negative lr ", max_lr);
  init();
}

double ConstantLR::lr_at(int64_t) const { return max_lr_; }

WarmupCosineLR::WarmupCosineLR(Optimizer& opt, double max_lr, double min_lr, int64_t warmup, int64_t decay,
                               double init_lr)
    : LRScheduler(opt), max_lr_(max_lr), min_lr_(min_lr), init_lr_(init_lr), warmup_(warmup), decay_(decay) {
  check_schedule("WarmupCosineLR", max_lr, min_lr, warmup, decay, init_lr);
  init();
}

double WarmupCosineLR::lr_at(int64_t step) const {
  if (step < warmup_) return warmup_lr(step, warmup_, init_lr_, max_lr_);
  if (step > decay_) return min_lr_;
  const double r = decay_ratio(step, warmup_, decay_);
  return min_lr_ + 0.5 * (max_lr_ - min_lr_) * (1.0 + std::cos(M_PI * r));
}

WarmupLinearLR::WarmupLinearLR(Optimizer& opt, double max_lr, double min_lr, int64_t warmup, int64_t decay,
                               double init_lr)
    : LRScheduler(opt), max_lr_(max_lr), min_lr_(min_lr), init_lr_(init_lr), warmup_(warmup), decay_(decay) {
  check_schedule("WarmupLinearLR", max_lr, min_lr, warmup, decay, init_lr);
  init();
}

double WarmupLinearLR::lr_at(int64_t step) const {
  if (step < warmup_) return warmup_lr(step, warmup_, init_lr_, max_lr_);
  if (step > decay_) return min_lr_;
  return min_lr_ + (max_lr_ - min_lr_) * (1.0 - decay_ratio(step, warmup_, decay_));
}

}  // namespace dtr::optim
