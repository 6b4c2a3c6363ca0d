#include "models/formats/llama_gguf_names.h"

#include "models/formats/qk_permute.h"
#include "tensor/error.h"

namespace dtr {

namespace {

// Registry of per-layer names: GGUF suffix after "blk.N." <-> HF suffix after "model.layers.N.".
struct LayerName {
  const char* gguf;
  const char* hf;
};
constexpr LayerName kLayerNames[] = {
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
constexpr LayerName kGlobalNames[] = {
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

}  // namespace

std::string gguf_to_hf_name(const std::string& g) {
  for (const auto& e : kGlobalNames)
    if (g == e.gguf) return e.hf;
  std::string n, rest;
  if (!split_layer(g, "blk.", n, rest)) return "";
  for (const auto& e : kLayerNames)
    if (rest == e.gguf) return "model.layers." + n + "." + e.hf;
  return "";
}

std::string hf_to_gguf_name(const std::string& h) {
  for (const auto& e : kGlobalNames)
    if (h == e.hf) return e.gguf;
  std::string n, rest;
  if (!split_layer(h, "model.layers.", n, rest)) return "";
  for (const auto& e : kLayerNames)
    if (rest == e.hf) return "blk." + n + "." + e.gguf;
  return "";
}

int64_t qk_permute_heads(const std::string& hf_name, const LlamaConfig& c) {
  auto ends = [&](const char* suf) {
    const std::string s(suf);
    return hf_name.size() >= s.size() && hf_name.compare(hf_name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends("self_attn.q_proj.weight") || ends("self_attn.q_proj.bias")) return c.num_attention_heads;
  if (ends("self_attn.k_proj.weight") || ends("self_attn.k_proj.bias")) return c.num_key_value_heads;
  return 0;
}

Shape expected_llama_shape(const std::string& h, const LlamaConfig& c) {
  const int64_t H = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  auto ends = [&](const std::string& s) { return h.size() >= s.size() && h.compare(h.size() - s.size(), s.size(), s) == 0; };
  if (h == "model.embed_tokens.weight" || h == "lm_head.weight") return {c.vocab_size, H};
  if (h == "model.norm.weight" || ends("layernorm.weight")) return {H};
  if (ends("q_proj.weight")) return {q, H};
  if (ends("k_proj.weight") || ends("v_proj.weight")) return {kv, H};
  if (ends("o_proj.weight")) return {H, q};
  if (ends("q_proj.bias")) return {q};
  if (ends("k_proj.bias") || ends("v_proj.bias")) return {kv};
  if (ends("o_proj.bias")) return {H};
  if (ends("gate_proj.weight") || ends("up_proj.weight")) return {c.intermediate_size, H};
  if (ends("down_proj.weight")) return {H, c.intermediate_size};
  return {};
}

safetensors::TensorMap load_gguf_llama_state_dict(const gguf::GGUFFile& g, const LlamaConfig& c) {
  safetensors::TensorMap out;
  for (const auto& ti : g.tensors()) {
    const std::string hf = gguf_to_hf_name(ti.name);
    if (hf.empty()) continue;
    const Shape shape = ti.shape();
    const Shape want = expected_llama_shape(hf, c);
    DTR_CHECK(shape == want, g.path(), ": tensor '", ti.name, "' (", hf, ") has shape ", shape, " but the config needs ",
              want);
    std::vector<float> v = g.dequantize(ti.name);
    if (const int64_t heads = qk_permute_heads(hf, c)) {
      v = unpermute_qk(v, shape[0], shape.size() > 1 ? shape[1] : 1, heads);
    }
    out[hf] = from_vector(v, shape);
  }
  auto need = [&](const std::string& name) {
    DTR_CHECK(out.count(name), g.path(), ": missing tensor '", hf_to_gguf_name(name), "' (", name, ")");
  };
  need("model.embed_tokens.weight");
  need("model.norm.weight");
  if (!c.tie_word_embeddings) need("lm_head.weight");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* s : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                          "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      need(p + s);
  }
  return out;
}

}  // namespace dtr
