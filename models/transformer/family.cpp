// The registry of model families (see family.h).
#include "models/transformer/family.h"

#include <map>

#include "tensor/error.h"

namespace dtr {
namespace {

std::map<std::string, ModelFamily>& registry() {
  static std::map<std::string, ModelFamily> r;
  return r;
}

}  // namespace

void register_model_family(ModelFamily f) {
  DTR_CHECK(!f.model_type.empty() && !f.class_prefix.empty(), "register_model_family: empty model_type or class name");
  DTR_CHECK(!registry().count(f.model_type), "register_model_family: model_type '", f.model_type,
            "' registered twice");
  const std::string key = f.model_type;
  registry().emplace(key, std::move(f));
}

std::string supported_model_types() {
  std::string s;
  for (const auto& [k, f] : registry()) s += (s.empty() ? "" : ", ") + k;
  return s;
}

const ModelFamily& model_family(const std::string& model_type, const std::string& source) {
  auto it = registry().find(model_type);
  DTR_CHECK(it != registry().end(), source, ": model_type '", model_type, "' is not supported (supported: ",
            supported_model_types(), ")");
  return it->second;
}

const ModelFamily* model_family_for_gguf(const gguf::GGUFFile& g, const std::string& arch) {
  const ModelFamily* fallback = nullptr;
  for (const auto& [k, f] : registry()) {
    if (f.gguf_architecture != arch) continue;
    if (!f.gguf_matches) fallback = &f;
    else if (f.gguf_matches(g, arch + ".")) return &f;
  }
  return fallback;
}

std::vector<GGUFLayerName> llama_gguf_layer_names() {
  return {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.bias", "self_attn.o_proj.bias"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
}

}  // namespace dtr
