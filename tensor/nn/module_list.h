#pragma once
// nn::ModuleList: an indexed list of submodules named "0", "1", ... (so FQNs read
// "layers.3.mlp.up_proj.weight"). Source: torch.nn.ModuleList.
#include "tensor/nn/module.h"

namespace dtr::nn {

/// Has no forward of its own. Errors: index out of range; null module.
class ModuleList : public Module {
 public:
  ModuleList() = default;
  explicit ModuleList(const std::vector<std::shared_ptr<Module>>& modules);
  std::string type_name() const override { return "ModuleList"; }

  /// Appends `m` under the name of its index.
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return children().size(); }
  /// Module i (negative counts from the end).
  std::shared_ptr<Module> operator[](int64_t i) const;
  /// Module i cast to M. Errors: i out of range, wrong type.
  template <class M>
  std::shared_ptr<M> at(int64_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    DTR_CHECK(m != nullptr, "ModuleList: element ", i, " is a ", (*this)[i]->type_name(), ", not the requested type");
    return m;
  }
};

}  // namespace dtr::nn
