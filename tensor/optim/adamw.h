#pragma once
// AdamW with decoupled weight decay. Source: Loshchilov & Hutter 2019; torch.optim.AdamW
// (single-tensor path), reproduced operation by operation.
#include "tensor/optim/optimizer.h"

namespace dtr::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

/// Per parameter with a defined gradient, at step t (per-parameter count, from 1):
///   p <- p * (1 - lr * wd)
///   m <- lerp(m, g, 1 - beta1);   v <- beta2 * v + (1 - beta2) * g^2
///   p <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// One fused OpenMP loop per parameter over its local elements (CUDA parameters: one fused
/// kernel, op "adamw_update" in tensor/ops/cuda/adamw.cu, same math). Math in f64 for f64
/// parameters, f32 otherwise (bf16 / f16 parameters are rounded once per step); state
/// exp_avg / exp_avg_sq is kept in that math dtype.
/// Errors: invalid hyperparameters (negative lr / eps / wd, betas outside [0, 1)).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions opt = {});
  /// One group holding `params`.
  AdamW(const std::vector<Tensor>& params, AdamWOptions opt = {});
  std::string type_name() const override { return "AdamW"; }
  void step() override;
  const AdamWOptions& options() const { return opt_; }

 private:
  AdamWOptions opt_;
};

}  // namespace dtr::optim
