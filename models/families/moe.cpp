// The mixture-of-experts families: Qwen3-MoE (Qwen3MoeForCausalLM) and Mixtral
// (MixtralForCausalLM). Attention as their dense relatives (Qwen3: q/k norm, head_dim default
// 128; Mixtral: Mistral's, sliding window when set); MLPs nn::MoE (router, grouped experts) on
// the layers ModelConfig::is_moe_layer picks (Qwen3-MoE: decoder_sparse_step, mlp_only_layers;
// Mixtral: every layer). Keys: num_experts / num_local_experts, num_experts_per_tok,
// moe_intermediate_size (Mixtral: intermediate_size), norm_topk_prob (Mixtral: always true),
// router_aux_loss_coef. GGUF of MoE models (llama.cpp's *_exps tensors) is not built: reading or
// writing one is an error. Sidecar: the decoder parallelizer (attention TP as the dense families;
// experts through expert parallelism, distributed.ep_size), without the dense-MLP entries when
// every layer is MoE.
// Source: transformers/models/qwen3_moe, mixtral (configuration_*.py, modeling_*.py).
#include <algorithm>

#include "models/formats/json_keys.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/family.h"
#include "models/transformer/load.h"
#include "models/transformer/parallelizer.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

using namespace json_keys;

/// num_experts from `experts_key`, else from num_local_experts (transformers 5 writes Qwen3-MoE's
/// num_experts under that name).
void read_moe_keys(const nlohmann::json& j, ModelConfig& c, const char* experts_key, const std::string& src) {
  c.num_experts = j.contains(experts_key) ? req_int(j, experts_key, src) : req_int(j, "num_local_experts", src);
  c.num_experts_per_tok = req_int(j, "num_experts_per_tok", src);
  c.router_aux_loss_coef = opt_num(j, "router_aux_loss_coef", 0.001, src);
}

void write_moe_keys(const ModelConfig& c, nlohmann::json& j, const char* experts_key) {
  j[experts_key] = c.num_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  j["output_router_logits"] = c.router_aux_loss_coef != 0.0;
}

[[noreturn]] void no_gguf(const ModelConfig& c) {
  DTR_ERROR("GGUF for the MoE family ", c.model_type, " is not built (expert tensors); use the HF safetensors");
}

void full_attention_layers(ModelConfig& c) {
  if (c.layer_types.empty())
    c.layer_types.assign(c.num_hidden_layers, c.sliding_window > 0 ? "sliding_attention" : "full_attention");
}

ModelFamily qwen3_moe_family() {
  ModelFamily f;
  f.model_type = "qwen3_moe";
  f.class_prefix = "Qwen3Moe";
  f.gguf_architecture = "qwen3moe";
  f.read_json = [](const nlohmann::json& j, ModelConfig& c, const std::string& src) {
    DTR_CHECK(!c.mlp_bias, src, ": Qwen3-MoE has no mlp_bias");
    if (!j.contains("head_dim") || j["head_dim"].is_null()) c.head_dim = 128;  // Qwen3MoeConfig default
    c.qkv_bias = c.o_bias = c.attention_bias;
    c.qk_norm = true;
    read_moe_keys(j, c, "num_experts", src);
    c.moe_intermediate_size = req_int(j, "moe_intermediate_size", src);
    c.norm_topk_prob = opt_bool(j, "norm_topk_prob", false, src);
    c.decoder_sparse_step = opt_int(j, "decoder_sparse_step", 1, src);
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      DTR_CHECK(j["mlp_only_layers"].is_array(), src, ": mlp_only_layers must be a list of layer indices");
      c.mlp_only_layers = j["mlp_only_layers"].get<std::vector<int64_t>>();
    }
    DTR_CHECK(!opt_bool(j, "use_sliding_window", false, src), src,
              ": use_sliding_window = true is not built for Qwen3-MoE");
    c.sliding_window = 0;
    full_attention_layers(c);
  };
  f.write_json = [](const ModelConfig& c, nlohmann::json& j) {
    write_moe_keys(c, j, "num_experts");
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["attention_bias"] = c.attention_bias;
    j["use_sliding_window"] = false;
  };
  f.read_gguf = [](const gguf::GGUFFile&, const std::string&, ModelConfig& c) { no_gguf(c); };
  f.write_gguf = [](const ModelConfig& c, const std::string&, gguf::GGUFWriter&) { no_gguf(c); };
  return f;
}

ModelFamily mixtral_family() {
  ModelFamily f;
  f.model_type = "mixtral";
  f.class_prefix = "Mixtral";
  f.gguf_architecture = "mixtral";
  f.read_json = [](const nlohmann::json& j, ModelConfig& c, const std::string& src) {
    DTR_CHECK(!c.attention_bias && !c.mlp_bias, src, ": Mixtral has no attention_bias / mlp_bias");
    read_moe_keys(j, c, "num_local_experts", src);
    c.moe_intermediate_size = c.intermediate_size;  // MixtralConfig: each expert's width
    c.norm_topk_prob = true;                        // MixtralTopKRouter always renormalises
    full_attention_layers(c);
  };
  f.write_json = [](const ModelConfig& c, nlohmann::json& j) {
    write_moe_keys(c, j, "num_local_experts");
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  };
  f.read_gguf = [](const gguf::GGUFFile&, const std::string&, ModelConfig& c) { no_gguf(c); };
  f.write_gguf = [](const ModelConfig& c, const std::string&, gguf::GGUFWriter&) { no_gguf(c); };
  return f;
}

Tensor take(safetensors::TensorMap& sd, const std::string& k) {
  auto it = sd.find(k);
  DTR_CHECK(it != sd.end(), "MoE checkpoint: missing key ", k);
  Tensor t = it->second;
  sd.erase(it);
  return t;
}

}  // namespace

void group_expert_weights(const ModelConfig& c, safetensors::TensorMap& sd) {
  if (c.num_experts <= 0) return;
  const bool mixtral = c.model_type == "mixtral";
  const std::string mod = mixtral ? "block_sparse_moe." : "mlp.";
  const char* gate = mixtral ? "w1" : "gate_proj";
  const char* up = mixtral ? "w3" : "up_proj";
  const char* down = mixtral ? "w2" : "down_proj";
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string L = "model.layers." + std::to_string(l) + ".";
    if (sd.count(L + "mlp.experts.gate_up_proj")) continue;  // grouped already (transformers 5 in memory)
    std::vector<Tensor> gu, dn;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string E = L + mod + "experts." + std::to_string(e) + ".";
      gu.push_back(unsqueeze(cat({take(sd, E + gate + ".weight"), take(sd, E + up + ".weight")}, 0), 0));
      dn.push_back(unsqueeze(take(sd, E + down + ".weight"), 0));
    }
    sd[L + "mlp.experts.gate_up_proj"] = cat(gu, 0);
    sd[L + "mlp.experts.down_proj"] = cat(dn, 0);
    if (mixtral) sd[L + "mlp.gate.weight"] = take(sd, L + mod + "gate.weight");
  }
}

namespace {

/// The decoder plan without the dense-MLP entries when no layer has a dense MLP.
class MoEDecoderParallelizer : public DecoderParallelizer {
 public:
  ParallelizePlan tp_plan(nn::Module& model, const MeshContext& ctx) override {
    ParallelizePlan plan = DecoderParallelizer::tp_plan(model, ctx);
    const ModelConfig& c = dynamic_cast<CausalLM&>(model).config();
    bool dense = false;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) dense = dense || !c.is_moe_layer(i);
    if (!dense)
      plan.erase(std::remove_if(plan.begin(), plan.end(),
                                [](const auto& e) { return e.first.find(".mlp.") != std::string::npos; }),
                 plan.end());
    return plan;
  }
};

DTR_REGISTER_MODEL_FAMILY(qwen3_moe_family);
DTR_REGISTER_MODEL_FAMILY(mixtral_family);
DTR_REGISTER_MODEL_PARALLELIZER("Qwen3MoeForCausalLM", MoEDecoderParallelizer);
DTR_REGISTER_MODEL_PARALLELIZER("MixtralForCausalLM", MoEDecoderParallelizer);

}  // namespace
}  // namespace dtr
