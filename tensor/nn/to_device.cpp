// module_to_device (see to_device.h).
#include "tensor/nn/to_device.h"

#include <unordered_map>

#include "tensor/autograd/grad_mode.h"
#include "tensor/meta.h"

namespace dtr::nn {

void module_to_device(Module& m, Device device) {
  NoGradGuard no_grad;
  std::unordered_map<const TensorImpl*, Tensor> moved;  // tied tensors move once
  auto move = [&](const std::string& fqn, const Tensor& t) {
    DTR_CHECK(!t.is_distributed(), "module_to_device: \"", fqn, "\" is distributed; move the model to ", device,
              " before parallelizing it");
    auto it = moved.find(t.impl());
    if (it != moved.end()) return it->second;
    // A meta tensor (meta initialisation) moves without data: its recipe fills it on `device`.
    Tensor d = t.device() == device ? t : is_meta(t) ? meta_to_device(t, device) : t.detach().to(device);
    if (d.impl() != t.impl()) {
      if (t.requires_grad()) d.set_requires_grad(true);
      d.set_name(t.name());
    }
    moved.emplace(t.impl(), d);
    return d;
  };
  for (const auto& [fqn, p] : m.named_parameters("", true, /*remove_duplicate=*/false))
    m.set_parameter(fqn, move(fqn, p));
  for (const auto& [fqn, b] : m.named_buffers()) m.set_buffer(fqn, move(fqn, b));
}

}  // namespace dtr::nn
