#pragma once
// nn::RMSNorm. Source: Zhang & Sennrich 2019; HF LlamaRMSNorm; torch.nn.RMSNorm; HF Gemma3RMSNorm
// (the offset form).
#include "tensor/nn/module.h"

namespace dtr::nn {

/// y = x * rsqrt(mean(x^2, -1) + eps) * weight, or with `offset` (Gemma) * (1 + weight).
/// Parameter: weight [dim], ones (zeros with offset, so both start as the identity scale).
/// Input [..., dim] -> same shape. Errors: last dim != dim (from rms_norm()).
/// With offset, 1 + weight is formed in the weight's dtype (bf16 weights round it to bf16;
/// HF forms it in f32).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, DType dtype = DType::f32, bool offset = false);
  std::string type_name() const override { return "RMSNorm"; }
  Tensor forward(const Tensor& x) override;
  Tensor weight() const { return parameter("weight"); }

  const int64_t dim;
  const double eps;
  const bool offset;
};

}  // namespace dtr::nn
