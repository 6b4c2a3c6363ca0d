#pragma once
// nn::Linear: y = x W^T + b. Source: torch.nn.Linear.
#include "tensor/nn/module.h"

namespace dtr::nn {

/// Parameters: weight [out, in], bias [out] (optional). Init like PyTorch's reset_parameters
/// (kaiming_uniform with a = sqrt(5)): weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)), drawn
/// from the Philox generator (deterministic by seed). Input [..., in] -> output [..., out].
/// init = false: zeros and no random draw (weights about to be loaded; like torch's skip_init).
/// Errors: negative sizes; input last dim != in (from linear()).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return "Linear"; }
  Tensor forward(const Tensor& x) override;
  /// {x} -> {forward(x)}; {x [..., in], targets [...] int64} -> {mean cross-entropy of x W^T
  /// against targets (ignore_index -100)} through the fused linear_cross_entropy, without the
  /// [tokens, out] logits (the loss-taking head of a causal LM; hooks see both inputs).
  /// Errors: other input counts, a bias (the fused head has none), targets not matching x.
  std::vector<Tensor> forward_list(const std::vector<Tensor>& inputs) override;
  Tensor weight() const { return parameter("weight"); }
  /// Undefined when the layer has no bias.
  Tensor bias() const { return has_parameter("bias") ? parameter("bias") : Tensor(); }

  const int64_t in_features;
  const int64_t out_features;
};

}  // namespace dtr::nn
