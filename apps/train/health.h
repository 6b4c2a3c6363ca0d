#pragma once
// Training health checks of dtr-train, decided from values every rank holds identically (the
// dp-summed loss, the global gradient norm), so every rank takes the same decision without
// extra communication.
//   - non-finite loss or gradient norm: step_scheduler.on_nonfinite = error (stop: no update,
//     no checkpoint, nothing pruned) or skip (no update for this step; the data and the LR
//     schedule move on, as PyTorch's GradScaler skips a step; kMaxConsecutiveSkips skipped
//     steps in a row stop the run);
//   - a collapsed run: grad norm exactly 0 for kCollapseSteps steps, or a loss unchanged
//     (relative 1e-7) for kCollapseSteps steps: one warning.
#include <cstdint>
#include <optional>
#include <string>

#include "tensor/error.h"

namespace dtr::train {

/// An error raised on every rank at the same point with the same message (a decision made from
/// values all ranks hold): rank 0 prints it and every rank returns 1; the job is not aborted.
class AllRanksError : public Error {
 public:
  using Error::Error;
};

class TrainingHealth {
 public:
  static constexpr int kMaxConsecutiveSkips = 10;
  static constexpr int kCollapseSteps = 5;

  /// on_nonfinite: "error" or "skip".
  explicit TrainingHealth(std::string on_nonfinite) : on_nonfinite_(std::move(on_nonfinite)) {}

  /// After the backward of `step` (1-based): true when the optimizer may update, false when
  /// this step is skipped (the caller zeroes the gradients). Throws AllRanksError when the
  /// run must stop (policy error, or too many skips in a row), naming the step and the values.
  bool admit(int64_t step, double loss, double grad_norm);

  /// After a step that updated: a warning line (once per run) when the run looks collapsed.
  std::optional<std::string> collapse_warning(int64_t step, double loss, double grad_norm);

  int64_t skipped() const { return skipped_total_; }

 private:
  std::string on_nonfinite_;
  int consecutive_skips_ = 0;
  int64_t skipped_total_ = 0;
  int zero_norm_steps_ = 0, flat_loss_steps_ = 0;
  double prev_loss_ = 0;
  bool have_prev_ = false, warned_ = false;
};

}  // namespace dtr::train
