// Training health checks (see health.h).
#include "apps/train/health.h"

#include <cmath>
#include <cstdio>

namespace dtr::train {
namespace {

std::string num(double v) {
  if (std::isnan(v)) return "nan";  // not "-nan"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

bool TrainingHealth::admit(int64_t step, double loss, double grad_norm) {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) {
    consecutive_skips_ = 0;
    return true;
  }
  const std::string what = "step " + std::to_string(step) + ": " +
                           (std::isfinite(loss) ? "gradient norm is " + num(grad_norm) + " (loss " + num(loss) + ")"
                                                : "loss is " + num(loss) + " (gradient norm " + num(grad_norm) + ")");
  if (on_nonfinite_ != "skip")
    throw AllRanksError(what + ": training diverged; stopped before the update (no checkpoint written, none "
                               "removed; lower optimizer.lr, set optimizer.max_grad_norm, or "
                               "step_scheduler.on_nonfinite: skip)");
  ++skipped_total_;
  if (++consecutive_skips_ >= kMaxConsecutiveSkips)
    throw AllRanksError(what + ": " + std::to_string(consecutive_skips_) +
                        " steps in a row were not finite (step_scheduler.on_nonfinite: skip); stopped");
  return false;
}

std::optional<std::string> TrainingHealth::collapse_warning(int64_t step, double loss, double grad_norm) {
  zero_norm_steps_ = grad_norm == 0 ? zero_norm_steps_ + 1 : 0;
  const bool flat = have_prev_ && std::fabs(loss - prev_loss_) <= 1e-7 * std::fabs(loss);
  flat_loss_steps_ = flat ? flat_loss_steps_ + 1 : 0;
  prev_loss_ = loss;
  have_prev_ = true;
  if (warned_) return std::nullopt;
  std::string why;
  if (zero_norm_steps_ >= kCollapseSteps)
    why = "the gradient norm has been 0 for " + std::to_string(zero_norm_steps_) + " steps";
  else if (flat_loss_steps_ + 1 >= kCollapseSteps)
    why = "the loss has stayed at " + num(loss) + " for " + std::to_string(flat_loss_steps_ + 1) + " steps";
  if (why.empty()) return std::nullopt;
  warned_ = true;
  return "step " + std::to_string(step) + ": " + why +
         ": the run looks collapsed (parameters not moving: check optimizer.lr, the data's label tokens, "
         "peft.target_modules)";
}

}  // namespace dtr::train
