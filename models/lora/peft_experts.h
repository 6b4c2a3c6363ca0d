#pragma once
// PEFT's layout of LoRA on grouped experts (PEFT >= 0.17 `target_parameters`, the ParamWrapper
// of a 3-d expert parameter), for nn::GroupedExperts' grouped adapters. With target_parameters
// ["experts.gate_up_proj", "experts.down_proj"] PEFT wraps the experts module twice: gate_up_proj
// is the inner wrapper, down_proj the outer, so their adapter keys under the experts' FQN are
//   <fqn>.base_layer.lora_A.weight [E r, H]    <fqn>.base_layer.lora_B.weight [2I, r E]
//   <fqn>.lora_A.weight            [E r, I]    <fqn>.lora_B.weight            [H, r E]
// A's rows are expert-major (row e r + j is row j of expert e: dtr's A [E, r, in] flattened);
// B's columns are rank-major (column j E + e: dtr's B [E, out, r] permuted to [out, r, E]).
// Source: peft/tuners/lora/layer.py ParamWrapper (get_delta_weight: "o r e, e r i -> e o i").
#include <map>
#include <string>

#include "tensor/nn/moe.h"

namespace dtr {

/// The adapter of `experts` (plain tensors: full_tensor first under expert parallelism) as PEFT
/// keys `<fqn>.base_layer.lora_A.weight` ... (fqn without "base_model.model."), contiguous.
/// Errors: the experts have no LoRA, or their adapters are distributed.
std::map<std::string, Tensor> peft_expert_lora_tensors(const std::string& fqn, const nn::GroupedExperts& experts);

/// The inverse: copies PEFT's four tensors at `fqn` from `sd` into the grouped adapters of
/// `experts` (LoRA enabled with the same rank). Errors: a missing key or a shape that is not E r x
/// in / out x r E (names the key, both shapes).
void load_peft_expert_lora(const std::string& fqn, const std::map<std::string, Tensor>& sd, nn::GroupedExperts& experts);

}  // namespace dtr
