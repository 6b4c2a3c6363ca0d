#pragma once
// The registry of model families (Llama, Mistral, Qwen2, Qwen3, Gemma 3): what differs between
// them besides the shared layers of models/transformer/ is data here: the HF model_type and class
// names, the family's config.json / GGUF keys, and how llama.cpp names and stores its tensors.
// Each family registers itself from its file in models/families/ (with its ModelParallelizer).
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/formats/hf_config.h"
#include "tensor/dispatch.h"  // DTR_CONCAT

namespace dtr {

/// GGUF tensor-name suffix after "blk.N." <-> HF suffix after "model.layers.N.". An HF tensor
/// may be several GGUF tensors joined along its second-to-last dim (`parts` equal slices, this
/// one slice `part`): Qwen3-MoE's mlp.experts.gate_up_proj [E, 2I, H] is llama.cpp's
/// ffn_gate_exps [E, I, H] (part 0) then ffn_up_exps (part 1).
struct GGUFLayerName {
  std::string gguf;
  std::string hf;
  int part = 0;
  int parts = 1;
};

struct ModelFamily {
  std::string model_type;        // HF config.json model_type, e.g. "qwen3"
  std::string class_prefix;      // HF class-name prefix: "Qwen3" -> Qwen3ForCausalLM, Qwen3Attention ...
  std::string gguf_architecture; // GGUF general.architecture written (and read) for this family
  /// When several families share a GGUF architecture (Mistral is written as "llama", as
  /// llama.cpp does): true when the metadata is this family's. Null: the architecture's default.
  std::function<bool(const gguf::GGUFFile&, const std::string& prefix)> gguf_matches;
  bool gguf_permute_qk = false;  // llama.cpp permutes q/k rows (its LlamaModel converter)
  double gguf_norm_shift = 0;    // llama.cpp stores RMSNorm weights + shift (Gemma: 1)
  /// Per-layer tensor names (every weight of a decoder layer the family may have).
  std::vector<GGUFLayerName> gguf_layer_names;
  /// Family keys of config.json after the common ones were read (defaults, derived switches).
  std::function<void(const nlohmann::json&, ModelConfig&, const std::string& source)> read_json;
  /// Family keys written into config.json after the common ones.
  std::function<void(const ModelConfig&, nlohmann::json&)> write_json;
  /// Family keys of GGUF metadata (prefix "<arch>."), after the common ones.
  std::function<void(const gguf::GGUFFile&, const std::string& prefix, ModelConfig&)> read_gguf;
  /// Family keys written as GGUF metadata. Errors: what the family's GGUF cannot represent.
  std::function<void(const ModelConfig&, const std::string& prefix, gguf::GGUFWriter&)> write_gguf;
};

/// Registers a family (from a static initialiser of its file). Errors: a model_type registered twice.
void register_model_family(ModelFamily f);
/// The family of an HF model_type. Errors: an unknown type -> dtr::Error listing the supported ones.
const ModelFamily& model_family(const std::string& model_type, const std::string& source = "config.json");
/// The family of GGUF metadata with general.architecture `arch`: the one whose gguf_matches
/// accepts `g`, else the one without gguf_matches; nullptr when none has that architecture.
const ModelFamily* model_family_for_gguf(const gguf::GGUFFile& g, const std::string& arch);
/// The registered model_types, sorted, comma separated (for messages).
std::string supported_model_types();

/// The Llama tensors of a decoder layer (q/k/v/o with biases, the two norms, gate/up/down).
std::vector<GGUFLayerName> llama_gguf_layer_names();

#define DTR_REGISTER_MODEL_FAMILY(make) \
  static const bool DTR_CONCAT(dtr_family_reg_, __LINE__) = (::dtr::register_model_family(make()), true)

}  // namespace dtr
