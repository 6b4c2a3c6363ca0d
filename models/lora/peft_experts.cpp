// PEFT layout of grouped expert adapters (see peft_experts.h).
#include "models/lora/peft_experts.h"

#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

struct Target {
  const char* param;   // dtr's parameter prefix
  const char* prefix;  // PEFT's key prefix under the experts' FQN
};
constexpr Target kTargets[] = {{"gate_up_proj", ".base_layer"}, {"down_proj", ""}};

}  // namespace

std::map<std::string, Tensor> peft_expert_lora_tensors(const std::string& fqn, const nn::GroupedExperts& experts) {
  DTR_CHECK(experts.has_lora(), "PEFT export: ", fqn, " has no LoRA adapters");
  NoGradGuard ng;
  std::map<std::string, Tensor> out;
  for (const Target& t : kTargets) {
    const Tensor a = experts.parameter(std::string(t.param) + "_lora_A");
    const Tensor b = experts.parameter(std::string(t.param) + "_lora_B");
    DTR_CHECK(!a.is_distributed() && !b.is_distributed(), "PEFT export: ", fqn, ".", t.param,
              " adapters are distributed (gather them with full_tensor first)");
    const int64_t E = a.size(0), r = a.size(1);
    out[fqn + t.prefix + ".lora_A.weight"] = a.detach().contiguous().reshape({E * r, a.size(2)});
    out[fqn + t.prefix + ".lora_B.weight"] = b.detach().permute({1, 2, 0}).contiguous().reshape({b.size(1), r * E});
  }
  return out;
}

void load_peft_expert_lora(const std::string& fqn, const std::map<std::string, Tensor>& sd, nn::GroupedExperts& experts) {
  DTR_CHECK(experts.has_lora(), "PEFT import: ", fqn, " has no LoRA adapters (enable_lora first)");
  NoGradGuard ng;
  for (const Target& t : kTargets) {
    Tensor a = experts.parameter(std::string(t.param) + "_lora_A");
    Tensor b = experts.parameter(std::string(t.param) + "_lora_B");
    const int64_t E = a.size(0), r = a.size(1);
    const std::string ka = fqn + t.prefix + ".lora_A.weight", kb = fqn + t.prefix + ".lora_B.weight";
    auto get = [&](const std::string& k, const Shape& want) {
      auto it = sd.find(k);
      DTR_CHECK(it != sd.end(), "PEFT import: missing key ", k);
      DTR_CHECK(it->second.sizes() == want, "PEFT import: ", k, " has shape ", it->second.sizes(), ", expected ", want);
      return it->second;
    };
    a.copy_(get(ka, {E * r, a.size(2)}).reshape({E, r, a.size(2)}).to(a.dtype()));
    b.copy_(get(kb, {b.size(1), r * E}).reshape({b.size(1), r, E}).permute({2, 0, 1}).to(b.dtype()));
  }
}

}  // namespace dtr
