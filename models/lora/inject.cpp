// LoRA injection (see inject.h).
#include "models/lora/inject.h"

#include <sstream>

#include "tensor/nn/moe.h"

namespace dtr {

bool wildcard_match(const std::string& p, const std::string& t) {
  // Iterative glob with backtracking to the last '*': O(|p| * |t|) worst case.
  size_t i = 0, j = 0, star = std::string::npos, mark = 0;
  while (j < t.size()) {
    if (i < p.size() && p[i] == '*') {
      star = i++;
      mark = j;
    } else if (i < p.size() && p[i] == t[j]) {
      ++i;
      ++j;
    } else if (star != std::string::npos) {
      i = star + 1;
      j = ++mark;
    } else {
      return false;
    }
  }
  while (i < p.size() && p[i] == '*') ++i;
  return i == p.size();
}

bool lora_pattern_matches(const std::string& pattern, const std::string& fqn) {
  const size_t dot = fqn.rfind('.');
  const std::string leaf = dot == std::string::npos ? fqn : fqn.substr(dot + 1);
  return pattern == leaf || wildcard_match(pattern, fqn);
}

namespace {

bool any_match(const std::vector<std::string>& patterns, const std::string& fqn) {
  for (const auto& p : patterns)
    if (lora_pattern_matches(p, fqn)) return true;
  return false;
}

std::string join(const std::vector<std::string>& v, size_t max_items = 8) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) os << (i ? ", " : "") << '"' << v[i] << '"';
  if (v.size() > max_items) os << ", ... (" << v.size() << " in all)";
  return os.str();
}

}  // namespace

bool is_lora_parameter(const std::string& fqn) {
  auto ends_with = [&](const std::string& s) {
    return fqn.size() >= s.size() && fqn.compare(fqn.size() - s.size(), s.size(), s) == 0 &&
           (fqn.size() == s.size() || fqn[fqn.size() - s.size() - 1] == '.');
  };
  auto grouped = [&](const char* ab) {  // GroupedExperts: <proj>_lora_A / _lora_B
    const std::string s = std::string("_") + ab;
    return fqn.size() > s.size() && fqn.compare(fqn.size() - s.size(), s.size(), s) == 0 &&
           fqn.find("experts.") != std::string::npos;
  };
  return ends_with("lora_A.weight") || ends_with("lora_B.weight") || grouped("lora_A") || grouped("lora_B");
}

std::vector<std::string> apply_lora(nn::Module& root, const LoraConfig& config) {
  DTR_CHECK(!config.target_modules.empty(), "apply_lora: target_modules is empty");
  std::vector<std::string> linears, replaced;
  std::vector<std::pair<std::string, std::shared_ptr<nn::Linear>>> todo;
  std::vector<std::pair<std::string, std::shared_ptr<nn::GroupedExperts>>> experts_todo;
  for (const auto& [fqn, m] : root.named_modules()) {
    if (auto ge = std::dynamic_pointer_cast<nn::GroupedExperts>(m); ge && !fqn.empty()) {
      linears.push_back(fqn);
      if (any_match(config.target_modules, fqn) && !any_match(config.exclude_modules, fqn) && !ge->has_lora())
        experts_todo.emplace_back(fqn, ge);
      continue;
    }
    auto lin = std::dynamic_pointer_cast<nn::Linear>(m);
    if (!lin || fqn.empty()) continue;
    // The children of a LoRALinear are Linears too; never wrap an adapter.
    if (fqn.size() >= 7 && (fqn.ends_with(".lora_A") || fqn.ends_with(".lora_B"))) continue;
    linears.push_back(fqn);
    if (any_match(config.target_modules, fqn) && !any_match(config.exclude_modules, fqn)) todo.emplace_back(fqn, lin);
  }
  DTR_CHECK(!todo.empty() || !experts_todo.empty(), "apply_lora: no Linear module matches target_modules [",
            join(config.target_modules), "] (exclude_modules [", join(config.exclude_modules),
            "]); Linear and grouped-experts modules: [", join(linears), "]");
  for (const auto& [fqn, lin] : todo) {
    root.set_submodule(fqn, std::make_shared<nn::LoRALinear>(lin, config.options));
    replaced.push_back(fqn);
  }
  for (const auto& [fqn, ge] : experts_todo) {  // NeMo Automodel's patch_moe_module: GroupedExpertsLoRA
    ge->enable_lora(config.options);
    replaced.push_back(fqn);
  }
  for (auto& [fqn, p] : root.named_parameters())
    if (!is_lora_parameter(fqn) && p.requires_grad()) p.set_requires_grad(false);
  return replaced;
}

std::vector<std::pair<std::string, std::shared_ptr<nn::LoRALinear>>> lora_modules(nn::Module& root) {
  std::vector<std::pair<std::string, std::shared_ptr<nn::LoRALinear>>> out;
  for (const auto& [fqn, m] : root.named_modules())
    if (auto l = std::dynamic_pointer_cast<nn::LoRALinear>(m)) out.emplace_back(fqn, l);
  return out;
}

int merge_lora(nn::Module& root) {
  int n = 0;
  for (auto& [fqn, l] : lora_modules(root))
    if (!l->merged()) {
      l->merge();
      ++n;
    }
  return n;
}

int unmerge_lora(nn::Module& root) {
  int n = 0;
  for (auto& [fqn, l] : lora_modules(root))
    if (l->merged()) {
      l->unmerge();
      ++n;
    }
  return n;
}

}  // namespace dtr
