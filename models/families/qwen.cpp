// The Qwen2 and Qwen3 families.
//   Qwen2 (Qwen2ForCausalLM, Qwen2.5): q/k/v projections with bias, o_proj without.
//   Qwen3 (Qwen3ForCausalLM): no biases unless attention_bias (then q/k/v/o), per-head RMSNorm of
//     q and k (self_attn.q_norm / k_norm, weight [head_dim]) before RoPE, head_dim default 128.
// Both: sliding-window attention on layers >= max_window_layers when use_sliding_window (HF
// layer_types when given). GGUF architectures "qwen2" / "qwen3" with the Llama tensor names (plus
// attn_q_norm / attn_k_norm), no Q/K permutation; llama.cpp writes no sliding-window keys for them,
// dtr writes <arch>.attention.sliding_window and <arch>.attention.max_window_layers when set.
// Source: transformers/models/qwen2, qwen3 (configuration_*.py, modeling_*.py); llama.cpp
// convert_hf_to_gguf.py (Qwen2Model, Qwen3Model).
#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/json_keys.h"
#include "models/transformer/family.h"
#include "models/transformer/parallelizer.h"
#include "tensor/error.h"

namespace dtr {
namespace {

using namespace json_keys;

void set_layer_types(ModelConfig& c) {
  if (!c.layer_types.empty()) return;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    c.layer_types.push_back(c.use_sliding_window && c.sliding_window > 0 && i >= c.max_window_layers
                                ? "sliding_attention"
                                : "full_attention");
}

void read_qwen_json(const nlohmann::json& j, ModelConfig& c, const std::string& src) {
  c.use_sliding_window = opt_bool(j, "use_sliding_window", false, src);
  c.max_window_layers = opt_int(j, "max_window_layers", 28, src);
  if (!c.use_sliding_window && j.value("layer_types", nlohmann::json()).is_null()) c.sliding_window = 0;  // HF: None
  set_layer_types(c);
}

void write_qwen_json(const ModelConfig& c, nlohmann::json& j) {
  j["use_sliding_window"] = c.use_sliding_window;
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  j["max_window_layers"] = c.max_window_layers;
  j["layer_types"] = c.layer_types;
}

void read_qwen_gguf(const gguf::GGUFFile& g, const std::string& p, ModelConfig& c) {
  c.max_window_layers = g.get_int(p + "attention.max_window_layers", c.num_hidden_layers);
  c.use_sliding_window = c.sliding_window > 0;
  set_layer_types(c);
}

void write_qwen_gguf(const ModelConfig& c, const std::string& p, gguf::GGUFWriter& w) {
  DTR_CHECK(!c.mlp_bias, "model_config_to_gguf: mlp_bias = true has no ", c.model_type, " GGUF form");
  bool sliding = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool want = c.use_sliding_window && c.sliding_window > 0 && i >= c.max_window_layers;
    DTR_CHECK(c.is_sliding(i) == want, "model_config_to_gguf: layer_types of this ", c.model_type,
              " model do not follow use_sliding_window / max_window_layers (not representable in GGUF)");
    sliding = sliding || want;
  }
  if (sliding) w.add_u32(p + "attention.max_window_layers", static_cast<uint32_t>(c.max_window_layers));
}

ModelFamily qwen2_family() {
  ModelFamily f;
  f.model_type = "qwen2";
  f.class_prefix = "Qwen2";
  f.gguf_architecture = "qwen2";
  f.gguf_layer_names = llama_gguf_layer_names();
  f.read_json = [](const nlohmann::json& j, ModelConfig& c, const std::string& src) {
    DTR_CHECK(!c.mlp_bias, src, ": Qwen2 has no mlp_bias");
    c.qkv_bias = true;  // Qwen2Attention: q/k/v bias=True, o_proj bias=False
    c.o_bias = false;
    read_qwen_json(j, c, src);
  };
  f.write_json = write_qwen_json;
  f.read_gguf = [](const gguf::GGUFFile& g, const std::string& p, ModelConfig& c) {
    c.qkv_bias = true;
    c.o_bias = false;
    c.attention_bias = false;
    read_qwen_gguf(g, p, c);
  };
  f.write_gguf = write_qwen_gguf;
  return f;
}

ModelFamily qwen3_family() {
  ModelFamily f;
  f.model_type = "qwen3";
  f.class_prefix = "Qwen3";
  f.gguf_architecture = "qwen3";
  f.gguf_layer_names = llama_gguf_layer_names();
  f.gguf_layer_names.push_back({"attn_q_norm.weight", "self_attn.q_norm.weight"});
  f.gguf_layer_names.push_back({"attn_k_norm.weight", "self_attn.k_norm.weight"});
  f.read_json = [](const nlohmann::json& j, ModelConfig& c, const std::string& src) {
    DTR_CHECK(!c.mlp_bias, src, ": Qwen3 has no mlp_bias");
    if (!j.contains("head_dim") || j["head_dim"].is_null()) c.head_dim = 128;  // Qwen3Config default
    c.qkv_bias = c.o_bias = c.attention_bias;
    c.qk_norm = true;
    read_qwen_json(j, c, src);
  };
  f.write_json = [](const ModelConfig& c, nlohmann::json& j) {
    write_qwen_json(c, j);
    j["attention_bias"] = c.attention_bias;
  };
  f.read_gguf = [](const gguf::GGUFFile& g, const std::string& p, ModelConfig& c) {
    c.qkv_bias = c.attention_bias;
    c.o_bias = g.has_tensor("blk.0.attn_output.bias");
    c.qk_norm = true;
    read_qwen_gguf(g, p, c);
  };
  f.write_gguf = write_qwen_gguf;
  return f;
}

DTR_REGISTER_MODEL_FAMILY(qwen2_family);
DTR_REGISTER_MODEL_FAMILY(qwen3_family);
DTR_REGISTER_MODEL_PARALLELIZER("Qwen2ForCausalLM", DecoderParallelizer);
DTR_REGISTER_MODEL_PARALLELIZER("Qwen3ForCausalLM", DecoderParallelizer);

}  // namespace
}  // namespace dtr
