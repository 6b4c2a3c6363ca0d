#pragma once
// Whole-model conversions behind dtr-convert.
#include <string>
#include <vector>

namespace dtr {

/// GGUF file -> Hugging Face directory: config.json, model.safetensors (f32; dequantised, Q/K
/// permutation undone), tokenizer.json + tokenizer_config.json (with the GGUF's chat template).
/// Errors: whatever reading the GGUF or writing the files raises (naming file and key).
void convert_gguf_to_hf(const std::string& gguf_path, const std::string& out_dir);

/// Base model (GGUF file or HF directory) + PEFT LoRA adapter -> merged HF directory. Returns
/// the adapted module FQNs.
std::vector<std::string> merge_adapter_to_hf(const std::string& base, const std::string& adapter_dir,
                                             const std::string& out_dir);

}  // namespace dtr
