// The Llama family (LlamaForCausalLM: SmolLM2, Llama 2 / 3 ...): attention_bias on q/k/v/o,
// mlp_bias, rope_scaling; GGUF architecture "llama" with llama.cpp's Q/K row permutation.
// Source: transformers/models/llama/configuration_llama.py; llama.cpp convert_hf_to_gguf.py
// (LlamaModel).
#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/family.h"
#include "models/transformer/parallelizer.h"
#include "tensor/error.h"

namespace dtr {

ModelConfig llama_debug_config() {
  ModelConfig c;
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 128;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.layer_types.assign(c.num_hidden_layers, "full_attention");
  return c;
}

namespace {

ModelFamily llama_family() {
  ModelFamily f;
  f.model_type = "llama";
  f.class_prefix = "Llama";
  f.gguf_architecture = "llama";
  f.gguf_permute_qk = true;
  f.gguf_layer_names = llama_gguf_layer_names();
  f.read_json = [](const nlohmann::json&, ModelConfig& c, const std::string& src) {
    DTR_CHECK(c.sliding_window == 0, src, ": sliding_window = ", c.sliding_window,
              " is not a Llama setting (model_type mistral has sliding-window attention)");
    c.qkv_bias = c.o_bias = c.attention_bias;
    c.layer_types.assign(c.num_hidden_layers, "full_attention");
  };
  f.write_json = [](const ModelConfig& c, nlohmann::json& j) {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
    j["pretraining_tp"] = 1;
  };
  f.read_gguf = [](const gguf::GGUFFile& g, const std::string&, ModelConfig& c) {
    c.qkv_bias = c.attention_bias;
    c.o_bias = g.has_tensor("blk.0.attn_output.bias");
    c.layer_types.assign(c.num_hidden_layers, "full_attention");
  };
  f.write_gguf = [](const ModelConfig& c, const std::string&, gguf::GGUFWriter&) {
    DTR_CHECK(!c.mlp_bias, "model_config_to_gguf: mlp_bias = true has no llama GGUF form");
  };
  return f;
}

DTR_REGISTER_MODEL_FAMILY(llama_family);
DTR_REGISTER_MODEL_PARALLELIZER("LlamaForCausalLM", DecoderParallelizer);

}  // namespace
}  // namespace dtr
