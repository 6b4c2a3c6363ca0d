#pragma once
// LoRA injection into a module tree: replaces matching nn::Linear submodules by
// nn::LoRALinear, enables the grouped adapters of matching nn::GroupedExperts (MoE experts, e.g.
// target "*.mlp.experts") and freezes everything that is not an adapter weight.
// Source: NeMo Automodel peft/lora.py (apply_lora_to_linear_modules, ModuleMatcher; a matched
// GroupedExperts becomes GroupedExpertsLoRA through patch_moe_module).
#include <memory>
#include <string>
#include <vector>

#include "tensor/nn/lora_linear.h"

namespace dtr {

/// What apply_lora targets and how the adapters look.
struct LoraConfig {
  /// Module patterns. A pattern matches a module when it equals the module's own (last)
  /// name, e.g. "q_proj", or when it matches the module's full FQN with '*' matching any
  /// run of characters (including '.'), e.g. "*_proj", "model.layers.0.*". NeMo's default.
  std::vector<std::string> target_modules = {"*_proj"};
  /// Same pattern rules; a module matching any of these is left alone.
  std::vector<std::string> exclude_modules;
  nn::LoraOptions options;
};

/// Glob match of `pattern` ('*' = any run of characters, everything else literal) against
/// the whole of `text`.
bool wildcard_match(const std::string& pattern, const std::string& text);
/// The pattern rule of LoraConfig::target_modules for module FQN `fqn`.
bool lora_pattern_matches(const std::string& pattern, const std::string& fqn);

/// Replaces every nn::Linear of `root` whose FQN matches a target and no exclude pattern by
/// an nn::LoRALinear wrapping it (Module::set_submodule; the base tensors are shared, not
/// copied), calls enable_lora on every matching nn::GroupedExperts (one adapter pair per
/// expert, same options), then sets requires_grad = false on every parameter that is not an
/// adapter (is_lora_parameter). Modules already adapted are not adapted twice. Returns the
/// adapted FQNs (Linears first, then experts, each in traversal order). Errors: nothing matches
/// (message lists the patterns and a few Linear / experts FQNs of the tree); invalid options (see
/// LoRALinear; experts: dropout != 0).
std::vector<std::string> apply_lora(nn::Module& root, const LoraConfig& config);

/// Every LoRALinear of `root` with its FQN, in traversal order.
std::vector<std::pair<std::string, std::shared_ptr<nn::LoRALinear>>> lora_modules(nn::Module& root);

/// True for adapter parameters: FQNs ending in "lora_A.weight" / "lora_B.weight", and the grouped
/// expert adapters "<...>experts.<proj>_lora_A" / "_lora_B".
bool is_lora_parameter(const std::string& fqn);

/// merge() on every unmerged LoRALinear of `root`; returns how many were merged.
int merge_lora(nn::Module& root);
/// unmerge() on every merged LoRALinear of `root`; returns how many were unmerged.
int unmerge_lora(nn::Module& root);

}  // namespace dtr
