#pragma once
// ModelConfig: the hyper-parameters of a decoder-only transformer of one of the supported
// families (Llama, Mistral, Qwen2, Qwen3, Gemma 3), read from a Hugging Face config.json
// (`model_type` selects the family) or from GGUF metadata (`general.architecture`), and written
// back as config.json / GGUF metadata. The family-specific keys are read and written by the
// family's entry in the registry of models/transformer/family.h.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dtr {
namespace gguf { class GGUFFile; class GGUFWriter; }

/// RoPE scaling (HF "rope_scaling"); type empty = none. Kept for export; "llama3" and
/// "linear" are the common types.
struct RopeScaling {
  std::string rope_type;                     // "", "linear", "dynamic", "yarn", "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;              // llama3
  double high_freq_factor = 4.0;             // llama3
  int64_t original_max_position_embeddings = 0;
};

/// Names and defaults follow transformers' LlamaConfig; the other families' keys beside them.
/// The flags below "family switches" are not config.json keys: the family sets them.
struct ModelConfig {
  std::string model_type = "llama";     // HF model_type: llama | mistral | qwen2 | qwen3 | gemma3_text
  int64_t vocab_size = 0;               // required
  int64_t hidden_size = 0;              // required
  int64_t intermediate_size = 0;        // required
  int64_t num_hidden_layers = 0;        // required
  int64_t num_attention_heads = 0;      // required
  int64_t num_key_value_heads = 0;      // default: num_attention_heads
  int64_t head_dim = 0;                 // default: hidden_size / num_attention_heads (Qwen3 128, Gemma 3 256)
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;          // HF attention_bias (Llama / Qwen3 / Gemma 3: q, k, v and o)
  bool mlp_bias = false;
  std::string hidden_act = "silu";      // silu (SwiGLU) | gelu_pytorch_tanh (GeGLU; Gemma's hidden_activation)
  int64_t bos_token_id = -1;            // -1 = none
  std::vector<int64_t> eos_token_ids;   // HF allows an int or a list
  int64_t pad_token_id = -1;
  RopeScaling rope_scaling;
  std::string torch_dtype = "float32";
  // Sliding-window attention (Mistral, Qwen2 / Qwen3 with use_sliding_window, Gemma 3 local layers):
  // a query at position i sees keys j with i - sliding_window < j <= i.
  int64_t sliding_window = 0;           // 0 = none
  bool use_sliding_window = false;      // Qwen2 / Qwen3 key
  int64_t max_window_layers = 0;        // Qwen2 / Qwen3 key: layers >= this one slide
  std::vector<std::string> layer_types; // per layer: full_attention | sliding_attention (filled on load)
  double rope_local_base_freq = 10000.0;  // Gemma 3: RoPE base of the sliding layers
  double query_pre_attn_scalar = 0;     // Gemma 3: attention scale = query_pre_attn_scalar^-0.5 (0: head_dim)
  double final_logit_softcapping = 0;   // logits = c * tanh(logits / c); 0 = none
  double attn_logit_softcapping = 0;    // 0 = none (anything else is rejected: not built)
  // Mixture of experts (Qwen3-MoE, Mixtral; read by their families): num_experts 0 = dense.
  int64_t num_experts = 0;              // Qwen3-MoE num_experts / Mixtral num_local_experts
  int64_t num_experts_per_tok = 0;      // top-k
  int64_t moe_intermediate_size = 0;    // each expert's width (Mixtral: intermediate_size)
  bool norm_topk_prob = true;           // renormalise the top-k weights (Mixtral: always)
  int64_t decoder_sparse_step = 1;      // Qwen3-MoE: layer i is MoE when (i + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers; // ... and i is not listed here
  double router_aux_loss_coef = 0.0;    // HF: loss += coef * load_balancing_loss (output_router_logits)
  // ---- family switches (set by the family, not read from config.json) ----
  bool qkv_bias = false;                // q/k/v projections have a bias (Qwen2: always)
  bool o_bias = false;                  // o_proj has a bias
  bool qk_norm = false;                 // per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
  bool norm_offset = false;             // RMSNorm scales by (1 + weight) (Gemma)
  bool scale_embeddings = false;        // embeddings * sqrt(hidden_size) (Gemma)
  bool sandwich_norms = false;          // Gemma 3: norms after attention and around the MLP

  /// First eos id or -1.
  int64_t eos_token_id() const { return eos_token_ids.empty() ? -1 : eos_token_ids.front(); }
  /// True when layer `i` uses sliding-window attention.
  bool is_sliding(int64_t i) const;
  /// True when layer `i`'s MLP is a mixture of experts (HF Qwen3MoeDecoderLayer's rule).
  bool is_moe_layer(int64_t i) const;
  /// Checks positivity and divisibility (heads | hidden when head_dim is derived, kv | heads),
  /// layer_types, the activation, and what is not built (attention softcapping).
  /// Errors: dtr::Error naming the key, its value and `source`.
  void validate(const std::string& source) const;
};
/// The Llama family's name for ModelConfig (the type was Llama-only before the families).
using LlamaConfig = ModelConfig;

/// From a parsed config.json. `source` names the file in messages. model_type (default "llama")
/// selects the family. Errors: an unknown model_type (naming the supported ones), a missing
/// required key or a value of the wrong type -> dtr::Error naming key and source.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& source);
/// From a config.json file, or a directory holding one.
ModelConfig load_model_config(const std::string& path);
/// From GGUF metadata (prefix = general.architecture, e.g. "llama."): embedding_length,
/// feed_forward_length, block_count, attention.head_count(_kv), rope.freq_base,
/// rope.dimension_count, attention.layer_norm_rms_epsilon, context_length, vocab_size
/// (else the tokenizer's token count), attention.sliding_window; tied embeddings when there is no
/// output.weight tensor; bos / eos / pad from tokenizer.ggml.*; then the family's own keys.
/// Errors: an unknown architecture, a missing required key (named).
ModelConfig model_config_from_gguf(const gguf::GGUFFile& g);
/// The inverse of model_config_from_gguf: general.architecture and the <arch>.* keys
/// (context_length, embedding_length, feed_forward_length, block_count, attention.head_count(_kv),
/// rope.freq_base, rope.dimension_count = head_dim, attention.key/value_length when head_dim is not
/// hidden / heads, attention.layer_norm_rms_epsilon (f32), vocab_size, rope.scaling.*), as
/// llama.cpp's convert_hf_to_gguf.py writes them, plus the family's keys. Token ids go with the
/// tokenizer metadata. Errors: what the family cannot represent (e.g. Llama's mlp_bias).
void model_config_to_gguf(const ModelConfig& c, gguf::GGUFWriter& w);
/// The config.json object (architectures [<Family>ForCausalLM], model_type, the family's keys).
nlohmann::json to_json(const ModelConfig& c);
/// Writes config.json atomically.
void save_model_config(const ModelConfig& c, const std::string& path);

}  // namespace dtr
