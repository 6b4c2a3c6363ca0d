// The Mistral family (MistralForCausalLM): the Llama architecture without biases, with
// sliding-window attention on every layer when sliding_window is set (Mistral 7B v0.1: 4096;
// later versions: null). GGUF: llama.cpp writes Mistral as architecture "llama" (permuted Q/K);
// dtr adds llama.attention.sliding_window when there is a window and reads a "llama" GGUF with
// that key as Mistral.
// Source: transformers/models/mistral/{configuration,modeling}_mistral.py.
#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/transformer/family.h"
#include "models/transformer/parallelizer.h"
#include "tensor/error.h"

namespace dtr {
namespace {

void set_layers(ModelConfig& c) {
  c.layer_types.assign(c.num_hidden_layers, c.sliding_window > 0 ? "sliding_attention" : "full_attention");
}

ModelFamily mistral_family() {
  ModelFamily f;
  f.model_type = "mistral";
  f.class_prefix = "Mistral";
  f.gguf_architecture = "llama";
  f.gguf_permute_qk = true;
  f.gguf_layer_names = llama_gguf_layer_names();
  f.gguf_matches = [](const gguf::GGUFFile& g, const std::string& p) {
    return g.has(p + "attention.sliding_window") && g.get_int(p + "expert_count", 0) == 0;  // experts: Mixtral
  };
  f.read_json = [](const nlohmann::json&, ModelConfig& c, const std::string& src) {
    DTR_CHECK(!c.attention_bias && !c.mlp_bias, src, ": Mistral has no attention_bias / mlp_bias");
    set_layers(c);
  };
  f.write_json = [](const ModelConfig& c, nlohmann::json& j) {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  };
  f.read_gguf = [](const gguf::GGUFFile&, const std::string&, ModelConfig& c) { set_layers(c); };
  return f;
}

DTR_REGISTER_MODEL_FAMILY(mistral_family);
DTR_REGISTER_MODEL_PARALLELIZER("MistralForCausalLM", DecoderParallelizer);

}  // namespace
}  // namespace dtr
