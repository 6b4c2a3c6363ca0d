// Final exports of dtr-train (see export.h).
#include "apps/train/export.h"

#include "dtensor/api.h"
#include "models/lora/inject.h"
#include "models/lora/peft.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"

namespace dtr::train {

std::vector<std::string> export_final(LlamaForCausalLM& model, const Recipe& r) {
  const bool adapter = r.peft.enabled, merged = r.checkpoint.save_consolidated;
  std::vector<std::string> lines;
  if (!adapter && !merged) return lines;
  NoGradGuard no_grad;
  // Decide what to gather before any rank touches its module: the list is then the same on
  // every rank, and so are the collectives.
  std::vector<std::pair<std::string, Tensor>> todo;
  for (const auto& [n, p] : model.named_parameters())
    if (p.is_distributed() && (merged || is_lora_parameter(n))) todo.emplace_back(n, p);
  const bool keep = dtr::rank() == 0;
  std::vector<std::pair<std::string, Tensor>> full;
  for (const auto& [n, p] : todo) {
    Tensor t = full_tensor(p.detach());
    if (keep) full.emplace_back(n, std::move(t));
  }
  if (!keep) return lines;
  for (const auto& [n, t] : full) model.set_parameter(n, t);
  if (adapter) {
    save_peft_adapter(model, r.checkpoint.adapter_dir, r.model.path);
    lines.push_back("PEFT adapter: " + r.checkpoint.adapter_dir);
  }
  if (merged) {
    const std::string dir = r.checkpoint.checkpoint_dir + "/consolidated";
    save_merged_model(model, dir);
    lines.push_back("merged HF safetensors: " + dir);
  }
  return lines;
}

}  // namespace dtr::train
