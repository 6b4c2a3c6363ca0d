// Llama loading and export (see load.h).
#include "models/transformer/load.h"

#include <filesystem>

#include "models/formats/gguf.h"
#include "models/formats/hf_config.h"
#include "models/transformer/gguf_names.h"
#include "models/lora/inject.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/nn/moe.h"
#include "tensor/ops.h"

namespace dtr {

void load_model_state_dict(CausalLM& model, safetensors::TensorMap sd, const std::string& source) {
  for (auto it = sd.begin(); it != sd.end();) {
    if (it->first.ends_with("rotary_emb.inv_freq")) it = sd.erase(it);
    else ++it;
  }
  group_expert_weights(model.config(), sd);
  if (model.tied()) {
    auto emb = sd.find("model.embed_tokens.weight");
    auto head = sd.find("lm_head.weight");
    if (emb != sd.end() && head == sd.end()) sd["lm_head.weight"] = emb->second;
  }
  try {
    model.load_state_dict(sd, /*strict=*/true);
  } catch (const Error& e) {
    DTR_ERROR(source, ": ", e.what());
  }
}

std::shared_ptr<CausalLM> load_model_gguf(const std::string& path, DType dtype) {
  const gguf::GGUFFile g = gguf::GGUFFile::open(path);
  const ModelConfig c = model_config_from_gguf(g);
  auto model = std::make_shared<CausalLM>(c, dtype, /*init=*/false);
  load_model_state_dict(*model, load_gguf_state_dict(g, c), path);
  return model;
}

std::shared_ptr<CausalLM> load_model_hf(const std::string& dir, DType dtype) {
  const ModelConfig c = load_model_config(dir);
  auto model = std::make_shared<CausalLM>(c, dtype, /*init=*/false);
  load_model_state_dict(*model, safetensors::load_checkpoint(dir), dir);
  return model;
}

std::shared_ptr<CausalLM> load_model(const std::string& path, DType dtype) {
  if (path.ends_with(".gguf")) return load_model_gguf(path, dtype);
  return load_model_hf(path, dtype);
}

safetensors::TensorMap model_export_state_dict(CausalLM& model) {
  NoGradGuard ng;
  safetensors::TensorMap out;
  for (const auto& [fqn, t] : model.state_dict()) {
    if (is_lora_parameter(fqn)) continue;
    if (model.tied() && fqn == "lm_head.weight") continue;
    out[fqn] = t;
  }
  for (const auto& [fqn, lora] : lora_modules(model)) out[fqn + ".weight"] = lora->merged_weight();
  // Experts with LoRA: W_e + scale B_e A_e per expert (one bmm per projection).
  for (const auto& [fqn, m] : model.named_modules())
    if (auto e = std::dynamic_pointer_cast<nn::GroupedExperts>(m); e && e->has_lora())
      for (const std::string p : {"gate_up_proj", "down_proj"})
        out[fqn + "." + p] = add(e->parameter(p).detach(), mul(bmm(e->parameter(p + "_lora_B").detach(),
                                                                   e->parameter(p + "_lora_A").detach()),
                                                               e->lora_scaling()));
  return out;
}

void save_model_hf(CausalLM& model, const std::string& dir, uint64_t max_shard_bytes) {
  std::filesystem::create_directories(dir);
  save_model_config(model.config(), (std::filesystem::path(dir) / "config.json").string());
  safetensors::save_sharded(model_export_state_dict(model), dir, max_shard_bytes, {{"format", "pt"}});
}

}  // namespace dtr
