// The mixture-of-experts families: Qwen3-MoE (Qwen3MoeForCausalLM) and Mixtral
// (MixtralForCausalLM). Attention as their dense relatives (Qwen3: q/k norm, head_dim default
// 128; Mixtral: Mistral's, sliding window when set); MLPs nn::MoE (router, grouped experts) on
// the layers ModelConfig::is_moe_layer picks (Qwen3-MoE: decoder_sparse_step, mlp_only_layers;
// Mixtral: every layer). Keys: num_experts / num_local_experts, num_experts_per_tok,
// moe_intermediate_size (Mixtral: intermediate_size), norm_topk_prob (Mixtral: always true),
// router_aux_loss_coef. GGUF: Qwen3-MoE as llama.cpp's qwen3moe (its Qwen3MoeModel converter):
// qwen3moe.expert_count, expert_used_count, expert_feed_forward_length, attention.key_length;
// the Qwen3 tensors (no Q/K permutation) with ffn_gate_inp (router) and the 3-D
// ffn_{gate,up,down}_exps on every layer (gguf_names.h). llama.cpp's qwen3moe renormalises the
// top-k weights and makes every layer MoE (transformers' GGUF loader sets norm_topk_prob true),
// so a model with norm_topk_prob false, decoder_sparse_step != 1 or mlp_only_layers has no
// GGUF form (an error on write); shared experts (expert_shared_feed_forward_length, Qwen2-MoE)
// are refused on read. Mixtral's GGUF (llama.cpp: architecture llama with llama.expert_count)
// is refused both ways: transformers' GGUF loader does not read it (its llama key mapping has
// no expert keys), so there is no reference to build it against. Sidecar: the decoder parallelizer (attention TP as the dense families;
// experts through expert parallelism, distributed.ep_size), without the dense-MLP entries when
// every layer is MoE.
// Source: transformers/models/qwen3_moe, mixtral (configuration_*.py, modeling_*.py).
#include <algorithm>

#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
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

void full_attention_layers(ModelConfig& c) {
  if (c.layer_types.empty())
    c.layer_types.assign(c.num_hidden_layers, c.sliding_window > 0 ? "sliding_attention" : "full_attention");
}

[[noreturn]] void no_mixtral_gguf(const std::string& where) {
  DTR_ERROR(where, ": Mixtral GGUF (general.architecture llama with llama.expert_count > 0) is not built: "
            "transformers' GGUF loader does not read it either; use the HF safetensors");
}

/// The Qwen3 tensors plus the MoE ones (router, experts; gate_up_proj from two GGUF tensors).
std::vector<GGUFLayerName> qwen3moe_gguf_layer_names() {
  std::vector<GGUFLayerName> v = llama_gguf_layer_names();
  v.push_back({"attn_q_norm.weight", "self_attn.q_norm.weight"});
  v.push_back({"attn_k_norm.weight", "self_attn.k_norm.weight"});
  v.push_back({"ffn_gate_inp.weight", "mlp.gate.weight"});
  v.push_back({"ffn_gate_exps.weight", "mlp.experts.gate_up_proj", 0, 2});
  v.push_back({"ffn_up_exps.weight", "mlp.experts.gate_up_proj", 1, 2});
  v.push_back({"ffn_down_exps.weight", "mlp.experts.down_proj"});
  return v;
}

void read_qwen3moe_gguf(const gguf::GGUFFile& g, const std::string& p, ModelConfig& c) {
  auto req = [&](const std::string& k) {
    (void)g.get(p + k);  // throws naming the key when it is missing
    return g.get_int(p + k, 0);
  };
  c.num_experts = req("expert_count");
  c.num_experts_per_tok = req("expert_used_count");
  c.moe_intermediate_size = req("expert_feed_forward_length");
  DTR_CHECK(g.get_int(p + "expert_shared_feed_forward_length", 0) == 0 && !g.has_tensor("blk.0.ffn_gate_inp_shexp.weight"),
            g.path(), ": ", p, "expert_shared_feed_forward_length: shared experts are not built for qwen3moe");
  c.norm_topk_prob = true;  // llama.cpp's qwen3moe graph; transformers' GGUF default
  c.decoder_sparse_step = 1;
  c.mlp_only_layers.clear();
  c.router_aux_loss_coef = 0.001;  // Qwen3MoeConfig default (training only; not in GGUF)
  c.qkv_bias = c.attention_bias;
  c.o_bias = g.has_tensor("blk.0.attn_output.bias");
  c.qk_norm = true;
  c.sliding_window = 0;
  full_attention_layers(c);
}

void write_qwen3moe_gguf(const ModelConfig& c, const std::string& p, gguf::GGUFWriter& w) {
  DTR_CHECK(c.norm_topk_prob && c.decoder_sparse_step == 1 && c.mlp_only_layers.empty(),
            "model_config_to_gguf: qwen3moe GGUF has every layer MoE with renormalised top-k weights; this model has "
            "norm_topk_prob = ", c.norm_topk_prob ? "true" : "false", ", decoder_sparse_step = ", c.decoder_sparse_step,
            ", mlp_only_layers = ", c.mlp_only_layers, " (not representable)");
  w.add_u32(p + "expert_count", static_cast<uint32_t>(c.num_experts));
  w.add_u32(p + "expert_used_count", static_cast<uint32_t>(c.num_experts_per_tok));
  w.add_u32(p + "expert_feed_forward_length", static_cast<uint32_t>(c.moe_intermediate_size));
  // llama.cpp writes head_dim whenever the config has one; transformers reads it from here only.
  if (c.head_dim * c.num_attention_heads == c.hidden_size) {
    w.add_u32(p + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.add_u32(p + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  }
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
  f.gguf_layer_names = qwen3moe_gguf_layer_names();
  f.read_gguf = read_qwen3moe_gguf;
  f.write_gguf = write_qwen3moe_gguf;
  return f;
}

ModelFamily mixtral_family() {
  ModelFamily f;
  f.model_type = "mixtral";
  f.class_prefix = "Mixtral";
  f.gguf_architecture = "llama";  // llama.cpp writes Mixtral as llama + llama.expert_count
  f.gguf_matches = [](const gguf::GGUFFile& g, const std::string& p) { return g.get_int(p + "expert_count", 0) > 0; };
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
  f.read_gguf = [](const gguf::GGUFFile& g, const std::string&, ModelConfig&) { no_mixtral_gguf(g.path()); };
  f.write_gguf = [](const ModelConfig&, const std::string&, gguf::GGUFWriter&) { no_mixtral_gguf("model_config_to_gguf"); };
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
