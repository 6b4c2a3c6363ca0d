#pragma once
// The gated feed-forward block of every family: down_proj(act(gate_proj(x)) * up_proj(x)),
// [.., hidden] -> same, with the activation of the config:
//   silu              SwiGLU (Llama, Mistral, Qwen2, Qwen3), one fused op (swiglu);
//   gelu_pytorch_tanh GeGLU with the tanh approximation of gelu (Gemma 3), one fused op (geglu).
// Source: Shazeer 2020 "GLU Variants Improve Transformer"; transformers *MLP classes.
#include <string>

#include "models/formats/hf_config.h"
#include "tensor/nn/module.h"

namespace dtr {

class GatedMLP : public nn::Module {
 public:
  /// Errors: an activation other than silu / gelu_pytorch_tanh.
  explicit GatedMLP(const ModelConfig& c, DType dtype = DType::f32, bool init = true);
  std::string type_name() const override { return prefix_ + "MLP"; }
  Tensor forward(const Tensor& x) override;

 private:
  std::string prefix_;
  bool gelu_;
};

}  // namespace dtr
