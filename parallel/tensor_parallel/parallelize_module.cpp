// parallelize_module: apply a TP plan (FQN patterns -> styles) to a module tree.
#include <iostream>

#include "parallel/tensor_parallel/style.h"
#include "runtime/env.h"

namespace dtr {
namespace {

/// fnmatch-style match of one component ('*' any run, '?' one char).
bool match_component(const char* p, const char* s) {
  if (*p == '\0') return *s == '\0';
  if (*p == '*') return match_component(p + 1, s) || (*s && match_component(p, s + 1));
  if (*s && (*p == '?' || *p == *s)) return match_component(p + 1, s + 1);
  return false;
}

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out{""};
  for (char c : s) {
    if (c == '.') out.emplace_back();
    else out.back() += c;
  }
  return out;
}

}  // namespace

bool fqn_matches(const std::string& pattern, const std::string& fqn) {
  const auto p = split_dots(pattern), f = split_dots(fqn);
  if (p.size() != f.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (!match_component(p[i].c_str(), f[i].c_str())) return false;
  return true;
}

void parallelize_module(nn::Module& module, const DeviceMesh& tp_mesh, const ParallelizePlan& plan) {
  DTR_CHECK(tp_mesh.ndim() == 1, "parallelize_module: the TP mesh must be 1-d, got ", tp_mesh.str());
  DistributeMemo memo;
  auto modules = module.named_modules();
  std::vector<std::string> unmatched;
  for (const auto& [pattern, style] : plan) {
    DTR_CHECK(style != nullptr, "parallelize_module: plan entry '", pattern, "' has no style");
    bool any = false;
    for (auto& [fqn, m] : modules) {
      if (fqn.empty() || !fqn_matches(pattern, fqn)) continue;
      style->apply(*m, fqn, tp_mesh, memo);
      any = true;
    }
    if (!any) unmatched.push_back(pattern);
  }
  if (!unmatched.empty() && rank() == 0) {
    std::string list;
    for (const auto& u : unmatched) list += (list.empty() ? "" : ", ") + u;
    std::cerr << "dtr: warning: parallelize_module: plan keys matched no module: " << list << "\n";
  }
}

}  // namespace dtr
