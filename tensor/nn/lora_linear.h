#pragma once
// nn::LoRALinear: a frozen linear layer plus a trainable low-rank update (LoRA).
//   y = x W^T + b + scale * B(A(x)),   scale = alpha / r   (rsLoRA: alpha / sqrt(r))
// Sources: Hu et al. 2021 "LoRA" (arXiv:2106.09685); Kalajdzievski 2023 "rsLoRA"
// (arXiv:2312.03732); NeMo Automodel's LinearLoRA (layout, dropout positions, init);
// Hugging Face PEFT (dropout on the adapter input).
//
// Layout (NeMo Automodel's LinearLoRA, not PEFT's base_layer wrapper): the frozen base
// weight [out, in] and bias [out] stay on this module under their original names, and the
// adapter is two bias-free child Linears:
//   <fqn>.weight, <fqn>.bias           base (requires_grad false after apply_lora)
//   <fqn>.lora_A.weight   [r, in]      Kaiming-uniform (a = sqrt 5) or Xavier-normal
//   <fqn>.lora_B.weight   [out, r]     zeros
// so a model with LoRA keeps Hugging Face names for its base weights; the PEFT export
// (models/lora/peft.h) maps these to base_model.model.<fqn>.lora_A.weight.
//
// Forward: with local operands and hook-free adapters, one autograd node (lora_linear,
// tensor/ops/nn_lora_linear.cpp) adds the adapter term into the base GEMM's output (addmm_)
// and, in the backward, into the input gradient; otherwise (DTensors, hooked adapters, dropout
// after B, bf16 / f16) the composed form below, which gives the same values.
//
// Tensor parallelism: forward reads its parameters and children by name at call time (so
// swapped-in distributed tensors and modules are used), calls lora_A / lora_B through
// Module::call (their forward hooks run: ColwiseParallelLora redistributes A's output), and
// applies the scale between A and B (RowwiseParallelLora keeps the branch Partial).
#include <memory>
#include <string>

#include "tensor/nn/linear.h"

namespace dtr::nn {

/// Where the LoRA dropout acts: on the adapter's input (PEFT) or on its output (NeMo default).
enum class LoraDropoutPosition { pre, post };
/// Initialisation of lora_A (lora_B is always zeros).
enum class LoraInit { kaiming, xavier };

/// "pre"/"post" and "kaiming"/"xavier" from strings (recipes). Errors: any other string.
LoraDropoutPosition lora_dropout_position_from_string(const std::string& s);
LoraInit lora_init_from_string(const std::string& s);
const char* to_string(LoraDropoutPosition p);
const char* to_string(LoraInit i);

/// Hyper-parameters of one LoRA adapter.
struct LoraOptions {
  int64_t r = 8;                 // rank (NeMo "dim")
  double alpha = 32.0;           // lora_alpha
  double dropout = 0.0;          // probability p in [0, 1)
  LoraDropoutPosition dropout_position = LoraDropoutPosition::post;
  bool use_rslora = false;       // scale alpha / sqrt(r) instead of alpha / r
  LoraInit init = LoraInit::xavier;
};

/// The adapter scale of `o`: alpha / r, or alpha / sqrt(r) with rsLoRA.
double lora_scale(const LoraOptions& o);

/// Input [..., in] -> output [..., out]; dtype of the base weight for A and B.
/// Training mode applies dropout (Philox, like nn::Dropout); eval does not.
/// After merge() the forward is the base linear only (the update lives in W).
/// Errors: r <= 0, dropout outside [0, 1), a null base.
class LoRALinear : public Module {
 public:
  /// Wraps `base`: shares its weight and bias tensors (no copy) and creates lora_A / lora_B.
  /// A is drawn from the global Philox generator (deterministic under manual_seed).
  LoRALinear(const std::shared_ptr<Linear>& base, const LoraOptions& opts);
  std::string type_name() const override { return "LoRALinear"; }
  Tensor forward(const Tensor& x) override;

  Tensor weight() const { return parameter("weight"); }
  /// Undefined when the base has no bias.
  Tensor bias() const { return has_parameter("bias") ? parameter("bias") : Tensor(); }
  std::shared_ptr<Linear> lora_A() const;
  std::shared_ptr<Linear> lora_B() const;

  const LoraOptions& options() const { return opts_; }
  double scale() const { return scale_; }
  bool merged() const { return merged_; }

  /// W += scale * B @ A (under NoGradGuard); afterwards forward skips the adapter.
  /// Errors: already merged.
  void merge();
  /// W -= scale * B @ A. Errors: not merged.
  void unmerge();
  /// W + scale * B @ A as a new tensor (W when already merged); the module is unchanged.
  Tensor merged_weight() const;

  const int64_t in_features;
  const int64_t out_features;

 private:
  Tensor delta_weight() const;
  /// True when forward can take the one-node lora_linear: local operands of one dtype (f32 /
  /// f64), adapters that are hook-free bias-free Linears.
  bool fusable(const Module& a, const Module& b, const Tensor& x) const;

  LoraOptions opts_;
  double scale_;
  bool merged_ = false;
};

}  // namespace dtr::nn
