// nn::Dropout (see dropout.h).
#include "tensor/nn/dropout.h"

#include "tensor/ops.h"

namespace dtr::nn {

Dropout::Dropout(double prob) : p(prob) {
  DTR_CHECK(prob >= 0.0 && prob <= 1.0, "Dropout: probability must be in [0, 1], got ", prob);
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p == 0.0) return x;
  return dropout(x, p, true);
}

}  // namespace dtr::nn
