#pragma once
// nn::RMSNorm. Source: Zhang & Sennrich 2019; HF LlamaRMSNorm; torch.nn.RMSNorm.
#include "tensor/nn/module.h"

namespace dtr::nn {

/// y = x * rsqrt(mean(x^2, -1) + eps) * weight. Parameter: weight [dim], ones.
/// Input [..., dim] -> same shape. Errors: last dim != dim (from rms_norm()).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, DType dtype = DType::f32);
  std::string type_name() const override { return "RMSNorm"; }
  Tensor forward(const Tensor& x) override;
  Tensor weight() const { return parameter("weight"); }

  const int64_t dim;
  const double eps;
};

}  // namespace dtr::nn
