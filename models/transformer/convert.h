#pragma once
// Whole-model conversions behind dtr-convert.
#include <string>
#include <vector>

#include "models/formats/gguf_writer.h"
#include "models/formats/hf_config.h"
#include "models/formats/safetensors.h"

namespace dtr {

/// What a conversion did with the base model's tokenizer: written (tokenizer files in the output
/// directory) or not, and then `missing` says why in one clause (for the tool's note), e.g. "the
/// GGUF holds no tokenizer (no tokenizer.ggml.tokens)".
struct TokenizerFiles {
  bool written = false;
  std::string missing;
};

/// GGUF file -> Hugging Face directory: config.json, model.safetensors (f32; dequantised, Q/K
/// permutation undone), tokenizer.json + tokenizer_config.json (with the GGUF's chat template) for a
/// byte-level BPE tokenizer (save_base_tokenizer). Without one (no tokenizer in the GGUF, or a
/// SentencePiece vocabulary such as Gemma's: no tokenizer.json writer for it yet) the model is
/// written without tokenizer files and the result says why.
/// Errors: whatever reading the GGUF or writing the files raises (naming file and key).
TokenizerFiles convert_gguf_to_hf(const std::string& gguf_path, const std::string& out_dir);

/// Float type of the 2-D weights written by convert_hf_to_gguf (1-D tensors stay F32).
enum class GGUFOutType { f32, f16, bf16 };
/// "f32" | "f16" | "bf16". Errors: anything else -> dtr::Error listing the choices.
GGUFOutType parse_gguf_outtype(const std::string& s);

/// Hugging Face model directory -> GGUF file, the inverse of convert_gguf_to_hf (as llama.cpp's
/// convert_hf_to_gguf.py does it for the family):
///  - metadata: general.architecture of the family, general.name, general.file_type, the <arch>.*
///    hyper-parameters of config.json (model_config_to_gguf), the tokenizer of tokenizer.json +
///    tokenizer_config.json (add_gguf_tokenizer; chat template from tokenizer_config.json or
///    chat_template.jinja; bos / eos / pad falling back to config.json's ids);
///  - tensors: model.safetensors or the sharded index, under llama.cpp names (hf_to_gguf_name),
///    q_proj / k_proj rows permuted back to llama.cpp's order (permute_qk), 2-D weights as
///    `outtype` (converted through f32: exact when the file already has that type), 1-D tensors
///    (norms, biases) and the MoE router F32; MoE experts as llama.cpp's 3-d *_exps tensors
///    (gate_up_proj split into ffn_gate_exps / ffn_up_exps). Nothing is quantised; lm_head.weight
///    is left out when tied.
/// Errors (dtr::Error naming the directory, file and tensor): missing config.json / tokenizer.json,
/// a tensor that is not a Llama weight or whose shape disagrees with the config, a missing weight.
void convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path,
                        GGUFOutType outtype = GGUFOutType::f32);

/// The tensors of an HF state dict `sd` of config `c` as GGUF tensors of `w` (the tensor part of
/// convert_hf_to_gguf): llama.cpp names of the family, Q/K rows permuted for the families llama.cpp
/// permutes, its norm shift added (Gemma: 1 + weight), token_embd / blocks / output order, 2-D
/// weights as `outtype`, 1-D F32; lm_head.weight left out when tied. `source` names the state
/// dict in messages. Errors: a tensor with no GGUF name or a wrong shape, a missing weight.
void add_gguf_model_tensors(gguf::GGUFWriter& w, const ModelConfig& c, safetensors::TensorMap sd, GGUFOutType outtype,
                            const std::string& source);

/// The tokenizer files of a base model into `out_dir`: from a GGUF with a byte-level BPE
/// tokenizer (tokenizer.ggml.model gpt2), tokenizer.json + tokenizer_config.json (with its chat
/// template); a GGUF without tokenizer.ggml.tokens, or with another tokenizer.ggml.model
/// (SentencePiece "llama", ...), writes none; from an HF directory, a copy of its tokenizer.json,
/// tokenizer_config.json, special_tokens_map.json and chat_template.jinja (those present).
/// Returns what was written and, when nothing, why.
TokenizerFiles save_base_tokenizer(const std::string& base, const std::string& out_dir);

/// Base model (GGUF file or HF directory) + PEFT LoRA adapter -> merged HF directory, with the
/// base's tokenizer files (save_base_tokenizer), so the output loads in transformers with its
/// tokenizer and converts back to GGUF. Returns the adapted module FQNs.
std::vector<std::string> merge_adapter_to_hf(const std::string& base, const std::string& adapter_dir,
                                             const std::string& out_dir);

}  // namespace dtr
