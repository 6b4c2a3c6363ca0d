// optim_local (see local.h).
#include "tensor/optim/local.h"

namespace dtr::optim {
namespace {
LocalConverter& converter() {
  static LocalConverter c;
  return c;
}
}  // namespace

Tensor optim_local(const Tensor& t) {
  if (!t.defined() || !t.is_distributed()) return t;
  DTR_CHECK(converter() != nullptr, "optimizer: parameter of shape ", t.sizes(), " is distributed (",
            t.dist_spec()->str(), ") but no local-tensor converter is registered (the dtensor layer registers one)");
  Tensor l = converter()(t);
  DTR_CHECK(l.defined() && !l.is_distributed(), "optimizer: the local-tensor converter returned a ",
            l.defined() ? "distributed" : "undefined", " tensor");
  return l;
}

void set_optim_local_converter(LocalConverter fn) { converter() = std::move(fn); }

}  // namespace dtr::optim
