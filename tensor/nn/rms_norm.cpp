// nn::RMSNorm (see rms_norm.h).
#include "tensor/nn/rms_norm.h"

#include "tensor/ops.h"

namespace dtr::nn {

RMSNorm::RMSNorm(int64_t d, double e, DType dtype, bool off) : dim(d), eps(e), offset(off) {
  DTR_CHECK(d >= 0, "RMSNorm: negative dim ", d);
  DTR_CHECK(e >= 0, "RMSNorm: negative eps ", e);
  register_parameter("weight", off ? zeros({d}, TensorOptions(dtype)) : ones({d}, TensorOptions(dtype)));
}

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, offset ? add(weight(), 1.0) : weight(), eps); }

}  // namespace dtr::nn
