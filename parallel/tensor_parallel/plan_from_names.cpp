#include "parallel/tensor_parallel/plan_from_names.h"

namespace dtr {
namespace {

/// True when no dotted component of `fqn` is a layer index other than 0.
bool first_layer_only(const std::string& fqn) {
  size_t b = 0;
  while (b <= fqn.size()) {
    size_t e = fqn.find('.', b);
    if (e == std::string::npos) e = fqn.size();
    const std::string c = fqn.substr(b, e - b);
    if (!c.empty() && c != "0" && c.find_first_not_of("0123456789") == std::string::npos) return false;
    b = e + 1;
  }
  return true;
}

}  // namespace

std::string tp_style_names() {
  return "colwise, rowwise, colwise_rep, rowwise_rep, sequence_parallel, embedding_rowwise, embedding_colwise, "
         "replicated_with_grad_allreduce";
}

std::shared_ptr<ParallelStyle> parallel_style_from_name(const std::string& n, const std::string& where) {
  if (n == "colwise") return std::make_shared<ColwiseParallel>();
  if (n == "rowwise") return std::make_shared<RowwiseParallel>();
  if (n == "colwise_rep" || n == "embedding_colwise") return std::make_shared<ColwiseParallel>(std::nullopt, Replicate());
  if (n == "rowwise_rep" || n == "embedding_rowwise") return std::make_shared<RowwiseParallel>(Replicate());
  if (n == "sequence_parallel") return std::make_shared<SequenceParallel>();
  if (n == "replicated_with_grad_allreduce") return std::make_shared<SequenceParallel>(2, true);
  DTR_ERROR(where, ": unknown tensor-parallel style '", n, "' (expected ", tp_style_names(), ")");
}

ParallelizePlan plan_from_names(const std::vector<std::pair<std::string, std::string>>& entries,
                                const std::string& where) {
  ParallelizePlan plan;
  for (const auto& [pattern, name] : entries) {
    if (pattern == "lm_head" && name == "colwise_rep")  // Automodel's loss-parallel lm_head
      plan.push_back({pattern, std::make_shared<ColwiseParallel>(Replicate(), Shard(-1), false)});
    else
      plan.push_back({pattern, parallel_style_from_name(name, where + "." + pattern)});
  }
  return plan;
}

void check_plan_matches(nn::Module& model, const ParallelizePlan& plan, const std::string& where) {
  const auto modules = model.named_modules();
  for (const auto& [pattern, style] : plan) {
    bool any = false;
    for (const auto& [fqn, m] : modules) any = any || (!fqn.empty() && fqn_matches(pattern, fqn));
    if (any) continue;
    // A few names to copy from: the leaf modules of the first layer (and outside the layers).
    std::string some;
    int n = 0;
    for (const auto& [fqn, m] : modules) {
      bool leaf = true;  // no children but LoRA's
      for (const auto& [name, c] : m->named_children()) leaf = leaf && name.starts_with("lora_");
      if (fqn.empty() || !leaf || !first_layer_only(fqn) || fqn.find("lora_") != std::string::npos) continue;
      if (n++ == 8) break;
      some += (some.empty() ? "" : ", ") + fqn;
    }
    DTR_ERROR(where, ": pattern '", pattern, "' matches no module of ", model.type_name(), " (module names are e.g. ",
              some, "; '*' matches one dotted component)");
  }
}

}  // namespace dtr
