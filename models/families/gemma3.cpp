// The Gemma 3 family (model_type gemma3_text, Gemma3ForCausalLM; e.g. gemma-3-270m):
// GeGLU MLP (gelu tanh), Gemma RMSNorm (x * (1 + weight)), four norms per layer (input,
// post-attention, pre- and post-feed-forward), per-head q/k norms, embeddings scaled by
// sqrt(hidden_size), head_dim independent of hidden / heads, sliding-window (local) layers with
// their own RoPE base (rope_local_base_freq) between global ones, attention scale
// query_pre_attn_scalar^-0.5, optional final logit soft-capping, tied embeddings by default.
// config.json: the transformers 4 keys (rope_theta, rope_local_base_freq, sliding_window_pattern)
// and the transformers 5 ones (rope_parameters.{full,sliding}_attention, layer_types).
// GGUF (architecture "gemma3"): llama.cpp stores every norm weight + 1 (its converter adds the 1 of
// Gemma3RMSNorm) and hard-codes what its metadata lacks: local RoPE base 10000 (newer files:
// gemma3.rope.freq_base_swa), a sliding-window pattern of 6, attention scale head_dim^-0.5
// (27B: hidden / heads). dtr writes gemma3.rope.freq_base_swa, and, when they differ from those
// defaults, gemma3.attention.sliding_window_pattern and gemma3.attention.query_pre_attn_scalar.
// Source: transformers/models/gemma3/{configuration,modeling}_gemma3.py; llama.cpp
// convert_hf_to_gguf.py (Gemma3Model) and src/llama-model.cpp (LLM_ARCH_GEMMA3).
#include <cmath>

#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/json_keys.h"
#include "models/transformer/family.h"
#include "models/transformer/parallelizer.h"
#include "tensor/error.h"

namespace dtr {
namespace {

using namespace json_keys;

constexpr int64_t kDefaultPattern = 6;  // Gemma3TextConfig._sliding_window_pattern

/// Layer i slides unless (i + 1) % pattern == 0 (every pattern-th layer is global).
std::vector<std::string> pattern_layers(int64_t n, int64_t pattern) {
  std::vector<std::string> t;
  for (int64_t i = 0; i < n; ++i) t.push_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
  return t;
}

void set_switches(ModelConfig& c) {
  c.qk_norm = c.norm_offset = c.scale_embeddings = c.sandwich_norms = true;
  c.qkv_bias = c.o_bias = c.attention_bias;
}

void read_json(const nlohmann::json& j, ModelConfig& c, const std::string& src) {
  DTR_CHECK(!c.mlp_bias, src, ": Gemma 3 has no mlp_bias");
  auto absent = [&](const char* k) { return !j.contains(k) || j[k].is_null(); };
  if (absent("head_dim")) c.head_dim = 256;
  if (absent("tie_word_embeddings")) c.tie_word_embeddings = true;
  if (absent("rope_theta")) c.rope_theta = 1000000.0;
  c.hidden_act = opt_str(j, "hidden_activation", "gelu_pytorch_tanh", src);
  c.query_pre_attn_scalar = opt_num(j, "query_pre_attn_scalar", 256, src);
  if (absent("sliding_window")) c.sliding_window = 4096;
  c.rope_local_base_freq = opt_num(j, "rope_local_base_freq", 10000.0, src);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {  // transformers >= 5
    const auto& rp = j["rope_parameters"];
    const std::string s = src + ": rope_parameters";
    for (const char* kind : {"full_attention", "sliding_attention"}) {
      if (!rp.contains(kind) || !rp[kind].is_object()) continue;
      const std::string type = opt_str(rp[kind], "rope_type", "default", s + "." + kind);
      DTR_CHECK(type == "default", s, ".", kind, ".rope_type = '", type, "' is not supported yet (only default)");
      double& theta = std::string(kind) == "full_attention" ? c.rope_theta : c.rope_local_base_freq;
      theta = opt_num(rp[kind], "rope_theta", theta, s + "." + kind);
    }
  }
  c.final_logit_softcapping = opt_num(j, "final_logit_softcapping", 0, src);
  c.attn_logit_softcapping = opt_num(j, "attn_logit_softcapping", 0, src);
  DTR_CHECK(!opt_bool(j, "use_bidirectional_attention", false, src), src,
            ": use_bidirectional_attention is not supported (causal attention only)");
  if (c.layer_types.empty()) {
    int64_t pattern = opt_int(j, "sliding_window_pattern", kDefaultPattern, src);
    pattern = opt_int(j, "_sliding_window_pattern", pattern, src);
    DTR_CHECK(pattern > 0, src, ": sliding_window_pattern = ", pattern, " must be positive");
    c.layer_types = pattern_layers(c.num_hidden_layers, pattern);
  }
  set_switches(c);
}

void write_json(const ModelConfig& c, nlohmann::json& j) {
  j.erase("hidden_act");
  j["hidden_activation"] = c.hidden_act;
  j["attention_bias"] = c.attention_bias;
  // An integer in transformers' Gemma3TextConfig (v5 rejects 24.0): written as one when it is whole.
  const double q = c.query_pre_attn_scalar;
  j["query_pre_attn_scalar"] = q == std::floor(q) ? nlohmann::json(static_cast<int64_t>(q)) : nlohmann::json(q);
  j["sliding_window"] = c.sliding_window;
  j["rope_local_base_freq"] = c.rope_local_base_freq;
  j["layer_types"] = c.layer_types;
  j["final_logit_softcapping"] = c.final_logit_softcapping > 0 ? nlohmann::json(c.final_logit_softcapping) : nullptr;
  j["attn_logit_softcapping"] = c.attn_logit_softcapping > 0 ? nlohmann::json(c.attn_logit_softcapping) : nullptr;
}

void read_gguf(const gguf::GGUFFile& g, const std::string& p, ModelConfig& c) {
  c.hidden_act = "gelu_pytorch_tanh";
  c.rope_local_base_freq = g.get_float(p + "rope.freq_base_swa", 10000.0);
  c.query_pre_attn_scalar = g.get_float(p + "attention.query_pre_attn_scalar", static_cast<double>(c.head_dim));
  c.final_logit_softcapping = g.get_float(p + "final_logit_softcapping", 0);
  c.attn_logit_softcapping = g.get_float(p + "attn_logit_softcapping", 0);
  const std::string pk = p + "attention.sliding_window_pattern";
  if (g.has(pk) && g.get(pk).is_array()) {  // per layer, true = sliding (llama.cpp's array form)
    const auto& a = g.get(pk).as_array();
    DTR_CHECK(static_cast<int64_t>(a.size()) == c.num_hidden_layers, g.path(), ": ", pk, " has ", a.size(),
              " entries for ", c.num_hidden_layers, " layers");
    for (const auto& v : a) c.layer_types.push_back(v.as_bool() ? "sliding_attention" : "full_attention");
  } else {
    const int64_t pattern = g.get_int(pk, kDefaultPattern);
    DTR_CHECK(pattern > 0, g.path(), ": ", pk, " = ", pattern, " must be positive");
    c.layer_types = pattern_layers(c.num_hidden_layers, pattern);
  }
  if (c.sliding_window == 0) c.sliding_window = 4096;
  set_switches(c);
}

void write_gguf(const ModelConfig& c, const std::string& p, gguf::GGUFWriter& w) {
  w.add_f32(p + "rope.freq_base_swa", static_cast<float>(c.rope_local_base_freq));
  if (c.query_pre_attn_scalar != static_cast<double>(c.head_dim))
    w.add_f32(p + "attention.query_pre_attn_scalar", static_cast<float>(c.query_pre_attn_scalar));
  if (c.final_logit_softcapping > 0) w.add_f32(p + "final_logit_softcapping", static_cast<float>(c.final_logit_softcapping));
  if (c.layer_types != pattern_layers(c.num_hidden_layers, kDefaultPattern)) {
    std::vector<gguf::Value> v;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) v.push_back(gguf::make_bool(c.is_sliding(i)));
    w.add(p + "attention.sliding_window_pattern", gguf::make_array(gguf::ValueType::bool_, std::move(v)));
  }
}

ModelFamily gemma3_family() {
  ModelFamily f;
  f.model_type = "gemma3_text";
  f.class_prefix = "Gemma3";
  f.gguf_architecture = "gemma3";
  f.gguf_norm_shift = 1.0;
  // Llama's names, but ffn_norm is the norm before the MLP, and three norms more (llama.cpp's
  // MODEL_ARCH.GEMMA3 tensors).
  for (auto& e : llama_gguf_layer_names())
    if (e.gguf != "ffn_norm.weight") f.gguf_layer_names.push_back(e);
  for (GGUFLayerName e : {GGUFLayerName{"attn_q_norm.weight", "self_attn.q_norm.weight"},
                          GGUFLayerName{"attn_k_norm.weight", "self_attn.k_norm.weight"},
                          GGUFLayerName{"post_attention_norm.weight", "post_attention_layernorm.weight"},
                          GGUFLayerName{"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
                          GGUFLayerName{"post_ffw_norm.weight", "post_feedforward_layernorm.weight"}})
    f.gguf_layer_names.push_back(e);
  f.read_json = read_json;
  f.write_json = write_json;
  f.read_gguf = read_gguf;
  f.write_gguf = write_gguf;
  return f;
}

DTR_REGISTER_MODEL_FAMILY(gemma3_family);
DTR_REGISTER_MODEL_PARALLELIZER("Gemma3ForCausalLM", DecoderParallelizer);

}  // namespace
}  // namespace dtr
