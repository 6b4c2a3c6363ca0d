// nn::Linear (see linear.h).
#include "tensor/nn/linear.h"

#include <cmath>

#include "tensor/ops.h"

namespace dtr::nn {

Linear::Linear(int64_t in, int64_t out, bool bias, DType dtype, bool init) : in_features(in), out_features(out) {
  DTR_CHECK(in >= 0 && out >= 0, "Linear: negative size (in_features ", in, ", out_features ", out, ")");
  DTR_CHECK(is_floating(dtype), "Linear: dtype must be floating, got ", dtype);
  if (!init) {
    register_parameter("weight", zeros({out, in}, TensorOptions(dtype)));
    if (bias) register_parameter("bias", zeros({out}, TensorOptions(dtype)));
    return;
  }
  const double bound = in > 0 ? 1.0 / std::sqrt(static_cast<double>(in)) : 0.0;
  register_parameter("weight", uniform({out, in}, -bound, bound, TensorOptions(dtype)));
  if (bias) register_parameter("bias", uniform({out}, -bound, bound, TensorOptions(dtype)));
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight(), bias()); }

std::vector<Tensor> Linear::forward_list(const std::vector<Tensor>& inputs) {
  if (inputs.size() == 1) return {forward(inputs[0])};
  DTR_CHECK(inputs.size() == 2, "Linear: expected {x} or {x, targets}, got ", inputs.size(), " inputs");
  DTR_CHECK(!bias().defined(), "Linear: the fused loss {x, targets} needs a layer without bias");
  const Tensor& x = inputs[0];
  const Tensor& t = inputs[1];
  DTR_CHECK(x.dim() >= 1 && t.dim() == x.dim() - 1, "Linear: targets ", t.sizes(), " must be x's shape ", x.sizes(),
            " without its last dim");
  return {linear_cross_entropy(reshape(x, {-1, x.size(-1)}), weight(), reshape(t, {-1}))};
}

}  // namespace dtr::nn
