// nn::ModuleList (see module_list.h).
#include "tensor/nn/module_list.h"

namespace dtr::nn {

ModuleList::ModuleList(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(m);
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  DTR_CHECK(m != nullptr, "ModuleList::push_back: null module");
  register_module(std::to_string(size()), std::move(m));
}

std::shared_ptr<Module> ModuleList::operator[](int64_t i) const {
  const auto kids = children();
  const int64_t n = static_cast<int64_t>(kids.size());
  DTR_CHECK(i >= -n && i < n, "ModuleList: index ", i, " out of range for a list of ", n, " modules");
  return kids[static_cast<size_t>(i < 0 ? i + n : i)];
}

}  // namespace dtr::nn
