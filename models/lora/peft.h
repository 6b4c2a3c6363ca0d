#pragma once
// Hugging Face PEFT LoRA adapters: export, import, merged export.
// Directory layout (peft.PeftModel.save_pretrained):
//   adapter_model.safetensors  keys base_model.model.<fqn>.lora_A.weight [r, in]
//                                   base_model.model.<fqn>.lora_B.weight [out, r]
//   adapter_config.json        peft_type "LORA", task_type "CAUSAL_LM", r, lora_alpha,
//                              lora_dropout, target_modules, bias "none",
//                              base_model_name_or_path, use_rslora, use_dora false, ...
// Source: peft/utils/save_and_load.py (get_peft_model_state_dict strips the adapter name
// "default"), peft/tuners/lora/config.py, peft/tuners/tuners_utils.py (check_target_module_exists:
// a list matches a module whose FQN equals an entry or ends with "." + entry; a string is a
// regex that must match the whole FQN).
#include <memory>
#include <string>
#include <vector>

#include "models/transformer/causal_lm.h"
#include "models/lora/inject.h"

namespace dtr {

/// The fields of adapter_config.json that dtr reads and writes.
struct PeftAdapterConfig {
  int64_t r = 8;
  double lora_alpha = 8.0;
  double lora_dropout = 0.0;
  bool use_rslora = false;
  /// List form of target_modules (short names such as "q_proj", or full FQNs) ...
  std::vector<std::string> target_modules;
  /// ... or, when non-empty, the regex form (PEFT: re.fullmatch against the module FQN).
  std::string target_regex;
  /// PEFT >= 0.17 target_parameters (MoE experts: "experts.gate_up_proj", "experts.down_proj" or
  /// full "<fqn>.gate_up_proj"; PEFT's rule: the key equals an entry or ends with "." + entry).
  std::vector<std::string> target_parameters;
  std::string base_model_name_or_path;
};

/// Reads and checks <dir>/adapter_config.json. Errors (naming the file and key): missing
/// file or keys, peft_type other than LORA, bias other than "none", use_dora, fan_in_fan_out,
/// non-empty rank_pattern / alpha_pattern / modules_to_save / layers_to_transform (not
/// supported).
PeftAdapterConfig read_peft_config(const std::string& dir);

/// Writes the adapter of every LoRALinear of `model` into `dir` (created if needed):
/// adapter_model.safetensors (f32 as held; metadata {"format": "pt"}) and adapter_config.json.
/// target_modules is the sorted list of the adapted modules' short names when that list
/// selects exactly the adapted modules, else a regex matching exactly their FQNs. MoE experts
/// with LoRA go in PEFT's target_parameters layout (models/lora/peft_experts.h): entries
/// "experts.gate_up_proj", "experts.down_proj" when every experts module is adapted, else their
/// full names; target_modules is [] when only experts are adapted.
/// Errors: no LoRALinear; adapters with different r / alpha / dropout / rsLoRA (PEFT's
/// rank_pattern is not written); distributed tensors (gather them first).
void save_peft_adapter(nn::Module& model, const std::string& dir, const std::string& base_model_name_or_path = "");

/// Injects LoRA into `model` as adapter_config.json of `dir` says (targets by PEFT's rule,
/// dropout on the adapter input as in PEFT; target_parameters enable the experts' grouped
/// adapters, both projections together) and loads the adapter weights. Returns the FQNs
/// adapted. Errors (naming file and key): the model already has LoRA modules; no module
/// matches; a key of the file that names no adapted module; an adapted module without
/// weights in the file; a shape that disagrees with the module.
std::vector<std::string> load_peft_adapter(nn::Module& model, const std::string& dir);

/// Merged export: a Hugging Face directory with every LoRA update merged into its base
/// weight and no lora keys (save_model_hf; the model is unchanged).
void save_merged_model(CausalLM& model, const std::string& dir);

}  // namespace dtr
