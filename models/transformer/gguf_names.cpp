#include "models/transformer/gguf_names.h"

#include "models/formats/qk_permute.h"
#include "tensor/ops.h"
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

GGUFPart gguf_part(const std::string& g, const std::string& model_type) {
  for (const auto& e : kGlobalNames)
    if (g == e.gguf) return {e.hf};
  std::string n, rest;
  if (!split_layer(g, "blk.", n, rest)) return {};
  for (const auto& e : model_family(model_type).gguf_layer_names)
    if (rest == e.gguf) return {"model.layers." + n + "." + e.hf, e.part, e.parts};
  return {};
}

std::string gguf_to_hf_name(const std::string& g, const std::string& model_type) {
  return gguf_part(g, model_type).hf;
}

std::vector<std::string> hf_to_gguf_names(const std::string& h, const std::string& model_type) {
  for (const auto& e : kGlobalNames)
    if (h == e.hf) return {e.gguf};
  std::string n, rest;
  if (!split_layer(h, "model.layers.", n, rest)) return {};
  std::vector<std::string> out;
  for (const auto& e : model_family(model_type).gguf_layer_names)
    if (rest == e.hf) {
      if (out.size() < static_cast<size_t>(e.parts)) out.resize(static_cast<size_t>(e.parts));
      out[static_cast<size_t>(e.part)] = "blk." + n + "." + e.gguf;
    }
  return out;
}

std::string hf_to_gguf_name(const std::string& h, const std::string& model_type) {
  const auto v = hf_to_gguf_names(h, model_type);
  return v.empty() ? "" : v[0];
}

Shape gguf_part_shape(const Shape& hf_shape, int parts) {
  Shape s = hf_shape;
  if (parts > 1 && s.size() >= 2) s[s.size() - 2] /= parts;
  return s;
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
    if (c.is_moe_layer(l)) {
      for (const char* s : {"mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"}) out.push_back(p + s);
    } else {
      for (const char* s : {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
        out.push_back(p + s + ".weight");
        if (c.mlp_bias) out.push_back(p + s + ".bias");
      }
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
  const int64_t E = c.num_experts, mI = c.moe_intermediate_size;
  if (ends(h, "mlp.gate.weight")) return {E, H};  // the MoE router
  if (ends(h, "mlp.experts.gate_up_proj")) return {E, 2 * mI, H};
  if (ends(h, "mlp.experts.down_proj")) return {E, H, mI};
  if (h.find(".experts.") != std::string::npos) {  // an HF checkpoint's expert E (Qwen3-MoE names)
    if (ends(h, "gate_proj.weight") || ends(h, "up_proj.weight")) return {mI, H};
    if (ends(h, "down_proj.weight")) return {H, mI};
  }
  if (ends(h, "gate_proj.weight") || ends(h, "up_proj.weight")) return {c.intermediate_size, H};
  if (ends(h, "down_proj.weight")) return {H, c.intermediate_size};
  if (ends(h, "gate_proj.bias") || ends(h, "up_proj.bias")) return {c.intermediate_size};
  if (ends(h, "down_proj.bias")) return {H};
  return {};
}

std::set<std::string> check_gguf_tensors(const gguf::GGUFFile& g, const ModelConfig& c) {
  const std::string arch = model_family(c.model_type).gguf_architecture;
  auto need = [&](const std::string& hf, const GGUFPart& pt) {
    std::string s = detail::cat(gguf_part_shape(expected_shape(hf, c), pt.parts));
    if (hf.find(".mlp.experts.") != std::string::npos || ends(hf, "mlp.gate.weight"))
      s += " (" + arch + ".expert_count = " + std::to_string(c.num_experts) + ", " + arch +
           ".expert_feed_forward_length = " + std::to_string(c.moe_intermediate_size) + ")";
    return s;
  };
  auto which = [](const std::string& hf, const GGUFPart& pt) {
    return pt.parts > 1 ? hf + ", part " + std::to_string(pt.part + 1) + " of " + std::to_string(pt.parts) : hf;
  };
  std::set<std::string> have;
  for (const auto& ti : g.tensors()) {
    const GGUFPart pt = gguf_part(ti.name, c.model_type);
    if (pt.hf.empty()) continue;
    const Shape want = gguf_part_shape(expected_shape(pt.hf, c), pt.parts);
    DTR_CHECK(ti.shape() == want, g.path(), ": tensor '", ti.name, "' (", which(pt.hf, pt), ") has shape ", ti.shape(),
              " but the config needs ", need(pt.hf, pt));
    have.insert(pt.hf);
  }
  std::set<std::string> check = have;
  for (const auto& name : required_tensor_names(c)) check.insert(name);
  for (const auto& hf : check) {
    const auto names = hf_to_gguf_names(hf, c.model_type);
    for (size_t k = 0; k < names.size(); ++k) {
      const GGUFPart pt{hf, static_cast<int>(k), static_cast<int>(names.size())};
      DTR_CHECK(g.has_tensor(names[k]), g.path(), ": missing tensor '", names[k], "' (", which(hf, pt),
                "), expected shape ", need(hf, pt));
    }
  }
  return have;
}

safetensors::TensorMap load_gguf_state_dict(const gguf::GGUFFile& g, const ModelConfig& c) {
  safetensors::TensorMap out;
  for (const auto& hf : check_gguf_tensors(g, c)) {
    std::vector<Tensor> parts;
    for (const auto& name : hf_to_gguf_names(hf, c.model_type)) {
      const Shape shape = g.tensor_info(name).shape();
      std::vector<float> v = g.dequantize(name);
      if (const int64_t heads = qk_permute_heads(hf, c)) {
        v = unpermute_qk(v, shape[0], shape.size() > 1 ? shape[1] : 1, heads);
      }
      if (const double shift = gguf_value_shift(hf, c); shift != 0)
        for (float& x : v) x -= static_cast<float>(shift);
      parts.push_back(from_vector(v, shape));
    }
    out[hf] = parts.size() == 1 ? parts[0] : cat(parts, parts[0].dim() - 2);
  }
  return out;
}

}  // namespace dtr
