// Final exports of dtr-train (see export.h).
#include "apps/train/export.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "dtensor/api.h"
#include "models/transformer/convert.h"
#include "models/lora/inject.h"
#include "models/lora/peft.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"

namespace dtr::train {

namespace fs = std::filesystem;

std::string peft_base_model(const Recipe& r, std::vector<std::string>& lines) {
  if (!r.checkpoint.base_model_name_or_path.empty()) return r.checkpoint.base_model_name_or_path;
  if (r.model.path.empty()) return "";  // a random model: nothing to name
  if (fs::is_directory(r.model.path)) return fs::absolute(r.model.path).string();
  // A GGUF file: PEFT cannot load it, so the base goes next to the adapter as an HF directory
  // (f32, as dtr-convert gguf-to-hf), written once.
  const fs::path dir = fs::absolute(fs::path(r.checkpoint.checkpoint_dir) / "base_model");
  if (!fs::exists(dir / "config.json")) {
    const TokenizerFiles tok = convert_gguf_to_hf(r.model.path, dir.string());
    lines.push_back("base model for PEFT (HF export of " + r.model.path + "): " + dir.string() +
                    (tok.written ? "" : " (no tokenizer files: " + tok.missing + ")"));
  }
  return dir.string();
}

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
    const std::string base = peft_base_model(r, lines);
    save_peft_adapter(model, r.checkpoint.adapter_dir, base);
    if (!r.model.path.empty()) {  // dtr's own record of the base it trained on (PEFT ignores the file)
      std::ofstream(fs::path(r.checkpoint.adapter_dir) / "dtr_adapter.json")
          << nlohmann::json{{"base_model_path", fs::absolute(r.model.path).string()},
                            {"base_model_name_or_path", base}}
                 .dump(1)
          << "\n";
    }
    lines.push_back("PEFT adapter: " + r.checkpoint.adapter_dir + (base.empty() ? "" : " (base " + base + ")"));
  }
  if (merged) {
    const std::string dir = r.checkpoint.checkpoint_dir + "/consolidated";
    save_merged_model(model, dir);
    if (!r.model.path.empty()) save_base_tokenizer(r.model.path, dir);
    lines.push_back("merged HF safetensors: " + dir);
  }
  return lines;
}

}  // namespace dtr::train
