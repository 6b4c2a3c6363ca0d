#pragma once
// LlamaConfig: the hyper-parameters of a Llama-architecture model, read from a Hugging Face
// config.json or from GGUF metadata (llama.* keys), and written back as config.json.
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

/// Names and defaults follow transformers.LlamaConfig.
struct LlamaConfig {
  int64_t vocab_size = 0;               // required
  int64_t hidden_size = 0;              // required
  int64_t intermediate_size = 0;        // required
  int64_t num_hidden_layers = 0;        // required
  int64_t num_attention_heads = 0;      // required
  int64_t num_key_value_heads = 0;      // default: num_attention_heads
  int64_t head_dim = 0;                 // default: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  int64_t bos_token_id = -1;            // -1 = none
  std::vector<int64_t> eos_token_ids;   // HF allows an int or a list
  int64_t pad_token_id = -1;
  RopeScaling rope_scaling;
  std::string torch_dtype = "float32";

  /// First eos id or -1.
  int64_t eos_token_id() const { return eos_token_ids.empty() ? -1 : eos_token_ids.front(); }
  /// Checks positivity and divisibility (heads | hidden when head_dim is derived, kv | heads).
  /// Errors: dtr::Error naming the key, its value and `source`.
  void validate(const std::string& source) const;
};

/// From a parsed config.json. `source` names the file in messages.
/// Errors: a missing required key or a value of the wrong type -> dtr::Error naming key and
/// source; model_type other than llama/mistral/qwen2-like is accepted if the keys are there.
LlamaConfig llama_config_from_json(const nlohmann::json& j, const std::string& source);
/// From a config.json file, or a directory holding one.
LlamaConfig load_llama_config(const std::string& path);
/// From GGUF metadata (prefix = general.architecture, e.g. "llama."): embedding_length,
/// feed_forward_length, block_count, attention.head_count(_kv), rope.freq_base,
/// rope.dimension_count, attention.layer_norm_rms_epsilon, context_length, vocab_size
/// (else the tokenizer's token count); tied embeddings when there is no output.weight tensor;
/// bos / eos / pad from tokenizer.ggml.*. Errors: a missing required key (named).
LlamaConfig llama_config_from_gguf(const gguf::GGUFFile& g);
/// The inverse of llama_config_from_gguf: general.architecture "llama" and the llama.* keys
/// (context_length, embedding_length, feed_forward_length, block_count, attention.head_count(_kv),
/// rope.freq_base, rope.dimension_count = head_dim, attention.key/value_length when head_dim is not
/// hidden / heads, attention.layer_norm_rms_epsilon (f32), vocab_size, rope.scaling.*), as
/// llama.cpp's convert_hf_to_gguf.py writes them. Token ids go with the tokenizer metadata.
/// Errors: mlp_bias (not representable in a llama GGUF) -> dtr::Error.
void llama_config_to_gguf(const LlamaConfig& c, gguf::GGUFWriter& w);
/// The config.json object (architectures ["LlamaForCausalLM"], model_type "llama").
nlohmann::json to_json(const LlamaConfig& c);
/// Writes config.json atomically.
void save_llama_config(const LlamaConfig& c, const std::string& path);

}  // namespace dtr
