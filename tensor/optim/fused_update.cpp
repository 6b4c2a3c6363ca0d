// Fused optimizer update plumbing (see fused_update.h).
#include "tensor/optim/fused_update.h"

namespace dtr::optim::detail {

UpdateOperands prepare(const Tensor& p, const Tensor& g, const char* opt, bool allow_cuda) {
  UpdateOperands u{optim_local(p), optim_local(g)};
  DTR_CHECK(u.param.sizes() == u.grad.sizes(), opt, ": local parameter of shape ", u.param.sizes(),
            " has a gradient of shape ", u.grad.sizes());
  if (allow_cuda) {
    DTR_CHECK(u.param.device() == u.grad.device(), opt, ": parameter on ", u.param.device(), " has a gradient on ",
              u.grad.device());
  } else {
    DTR_CHECK(u.param.device() == Device::cpu() && u.grad.device() == Device::cpu(), opt,
              ": only CPU parameters are supported by this step (parameter on ", u.param.device(), ", gradient on ",
              u.grad.device(), ")");
  }
  DTR_CHECK(u.param.is_contiguous(), opt, ": parameter of shape ", u.param.sizes(), " with strides ",
            u.param.strides(), " is not contiguous");
  if (!u.grad.is_contiguous()) u.grad = u.grad.contiguous();
  return u;
}

}  // namespace dtr::optim::detail
