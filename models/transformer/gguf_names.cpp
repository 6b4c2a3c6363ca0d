#include "models/transformer/gguf_names.h"

#include "models/formats/qk_permute.h"
#include "models/transformer/family.h"
#include "tensor/error.h"

namespace dtr {

namespace {

struct GlobalName {
  const char* gguf;
  const char* hf;
};
constexpr GlobalName kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// Splits "<prefix><N>.<rest>" -> (N, rest); false when `s` does not look like that.
bool split_layer(const std::string& s, const std::string& prefix, std::string& n, std::string& rest) {
  if (s.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t dot = s.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return false;
  n = s.substr(prefix.size(), dot - prefix.size());
  for (char ch : n)
    if (ch < '0' || ch > '9') return false;
  rest = s.substr(dot + 1);
  return true;
}

bool ends(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

}  // namespace

std::string gguf_to_hf_name(const std::string& g, const std::string& model_type) {
  for (const auto& e : kGlobalNames)
    if (g == e.gguf) return e.hf;
  std::string n, rest;
  if (!split_layer(g, "blk.", n, rest)) return "";
  for (const auto& e : model_family(model_type).gguf_layer_names)
    if (rest == e.gguf) return "model.layers." + n + "." + e.hf;
  return "";
}

std::string hf_to_gguf_name(const std::string& h, const std::string& model_type) {
  for (const auto& e : kGlobalNames)
    if (h == e.hf) return e.gguf;
  std::string n, rest;
  if (!split_layer(h, "model.layers.", n, rest)) return "";
  for (const auto& e : model_family(model_type).gguf_layer_names)
    if (rest == e.hf) return "blk." + n + "." + e.gguf;
  return "";
}

int64_t qk_permute_heads(const std::string& hf_name, const ModelConfig& c) {
  if (!model_family(c.model_type).gguf_permute_qk) return 0;
  if (ends(hf_name, "self_attn.q_proj.weight") || ends(hf_name, "self_attn.q_proj.bias")) return c.num_attention_heads;
  if (ends(hf_name, "self_attn.k_proj.weight") || ends(hf_name, "self_attn.k_proj.bias")) return c.num_key_value_heads;
  return 0;
}

double gguf_value_shift(const std::string& hf_name, const ModelConfig& c) {
  return ends(hf_name, "norm.weight") ? model_family(c.model_type).gguf_norm_shift : 0.0;
}

std::vector<std::string> required_tensor_names(const ModelConfig& c) {
  std::vector<std::string> out{"model.embed_tokens.weight"};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* s : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}) {
      out.push_back(p + s + ".weight");
      if (c.qkv_bias) out.push_back(p + s + ".bias");
    }
    out.push_back(p + "self_attn.o_proj.weight");
    if (c.o_bias) out.push_back(p + "self_attn.o_proj.bias");
    if (c.qk_norm) {
      out.push_back(p + "self_attn.q_norm.weight");
      out.push_back(p + "self_attn.k_norm.weight");
    }
    for (const char* s : {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      out.push_back(p + s + ".weight");
      if (c.mlp_bias) out.push_back(p + s + ".bias");
    }
    out.push_back(p + "input_layernorm.weight");
    out.push_back(p + "post_attention_layernorm.weight");
    if (c.sandwich_norms) {
      out.push_back(p + "pre_feedforward_layernorm.weight");
      out.push_back(p + "post_feedforward_layernorm.weight");
    }
  }
  out.push_back("model.norm.weight");
  if (!c.tie_word_embeddings) out.push_back("lm_head.weight");
  return out;
}

Shape expected_shape(const std::string& h, const ModelConfig& c) {
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  if (h == "model.embed_tokens.weight" || h == "lm_head.weight") return {c.vocab_size, H};
  if (h == "model.norm.weight" || ends(h, "layernorm.weight")) return {H};
  if (ends(h, "q_norm.weight") || ends(h, "k_norm.weight")) return {c.head_dim};
  if (ends(h, "q_proj.weight")) return {q, H};
  if (ends(h, "k_proj.weight") || ends(h, "v_proj.weight")) return {kv, H};
  if (ends(h, "o_proj.weight")) return {H, q};
  if (ends(h, "q_proj.bias")) return {q};
  if (ends(h, "k_proj.bias") || ends(h, "v_proj.bias")) return {kv};
  if (ends(h, "o_proj.bias")) return {H};
  if (ends(h, "gate_proj.weight") || ends(h, "up_proj.weight")) return {c.intermediate_size, H};
  if (ends(h, "down_proj.weight")) return {H, c.intermediate_size};
  if (ends(h, "gate_proj.bias") || ends(h, "up_proj.bias")) return {c.intermediate_size};
  if (ends(h, "down_proj.bias")) return {H};
  return {};
}

safetensors::TensorMap load_gguf_state_dict(const gguf::GGUFFile& g, const ModelConfig& c) {
  safetensors::TensorMap out;
  for (const auto& ti : g.tensors()) {
    const std::string hf = gguf_to_hf_name(ti.name, c.model_type);
    if (hf.empty()) continue;
    const Shape shape = ti.shape();
    const Shape want = expected_shape(hf, c);
    DTR_CHECK(shape == want, g.path(), ": tensor '", ti.name, "' (", hf, ") has shape ", shape, " but the config needs ",
              want);
    std::vector<float> v = g.dequantize(ti.name);
    if (const int64_t heads = qk_permute_heads(hf, c)) {
      v = unpermute_qk(v, shape[0], shape.size() > 1 ? shape[1] : 1, heads);
    }
    if (const double shift = gguf_value_shift(hf, c); shift != 0)
      for (float& x : v) x -= static_cast<float>(shift);
    out[hf] = from_vector(v, shape);
  }
  for (const auto& name : required_tensor_names(c))
    DTR_CHECK(out.count(name), g.path(), ": missing tensor '", hf_to_gguf_name(name, c.model_type), "' (", name, ")");
  return out;
}

}  // namespace dtr
