// Learning-rate schedules (see lr_scheduler.h).
#include "tensor/optim/lr_scheduler.h"

#include <cmath>

namespace dtr::optim {
namespace {

void check_schedule(const char* name, double max_lr, double min_lr, int64_t warmup, int64_t decay) {
  DTR_CHECK(max_lr >= 0.0 && min_lr >= 0.0 && min_lr <= max_lr, name, ": need 0 <= min_lr <= max_lr, got min_lr ",
            min_lr, ", max_lr ", max_lr);
  DTR_CHECK(warmup >= 0 && decay >= warmup, name, ": need 0 <= warmup_steps <= decay_steps, got warmup_steps ",
            warmup, ", decay_steps ", decay);
}

/// Fraction of the decay phase done at `step` (warmup <= step <= decay), 1 when it is empty.
double decay_ratio(int64_t step, int64_t warmup, int64_t decay) {
  if (decay == warmup) return 1.0;
  return static_cast<double>(step - warmup) / static_cast<double>(decay - warmup);
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

WarmupCosineLR::WarmupCosineLR(Optimizer& opt, double max_lr, double min_lr, int64_t warmup, int64_t decay)
    : LRScheduler(opt), max_lr_(max_lr), min_lr_(min_lr), warmup_(warmup), decay_(decay) {
  check_schedule("WarmupCosineLR", max_lr, min_lr, warmup, decay);
  init();
}

double WarmupCosineLR::lr_at(int64_t step) const {
  if (step < warmup_) return max_lr_ * static_cast<double>(step) / static_cast<double>(warmup_);
  if (step > decay_) return min_lr_;
  const double r = decay_ratio(step, warmup_, decay_);
  return min_lr_ + 0.5 * (max_lr_ - min_lr_) * (1.0 + std::cos(M_PI * r));
}

WarmupLinearLR::WarmupLinearLR(Optimizer& opt, double max_lr, double min_lr, int64_t warmup, int64_t decay)
    : LRScheduler(opt), max_lr_(max_lr), min_lr_(min_lr), warmup_(warmup), decay_(decay) {
  check_schedule("WarmupLinearLR", max_lr, min_lr, warmup, decay);
  init();
}

double WarmupLinearLR::lr_at(int64_t step) const {
  if (step < warmup_) return max_lr_ * static_cast<double>(step) / static_cast<double>(warmup_);
  if (step > decay_) return min_lr_;
  return min_lr_ + (max_lr_ - min_lr_) * (1.0 - decay_ratio(step, warmup_, decay_));
}

}  // namespace dtr::optim
