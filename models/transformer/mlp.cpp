// GatedMLP (see mlp.h).
#include "models/transformer/mlp.h"

#include "models/transformer/causal_lm.h"
#include "tensor/nn/linear.h"
#include "tensor/ops.h"
#include "tensor/ops/nn_swiglu.h"

namespace dtr {

GatedMLP::GatedMLP(const ModelConfig& c, DType dt, bool init)
    : prefix_(class_prefix(c)), gelu_(c.hidden_act == "gelu_pytorch_tanh") {
  DTR_CHECK(gelu_ || c.hidden_act == "silu", "GatedMLP: hidden_act '", c.hidden_act,
            "' is not supported (silu, gelu_pytorch_tanh)");
  const int64_t h = c.hidden_size, i = c.intermediate_size;
  register_module("gate_proj", std::make_shared<nn::Linear>(h, i, c.mlp_bias, dt, init));
  register_module("up_proj", std::make_shared<nn::Linear>(h, i, c.mlp_bias, dt, init));
  register_module("down_proj", std::make_shared<nn::Linear>(i, h, c.mlp_bias, dt, init));
}

Tensor GatedMLP::forward(const Tensor& x) {
  Tensor gate = get_submodule("gate_proj")->call(x), up = get_submodule("up_proj")->call(x);
  // act(gate) * up as one fused op (one pass forward, one backward): SwiGLU, or GeGLU with
  // gelu's tanh approximation (Gemma's gelu_pytorch_tanh).
  Tensor h = gelu_ ? geglu(gate, up) : swiglu(gate, up);
  return get_submodule("down_proj")->call(h);
}

}  // namespace dtr
