// LoRA-aware styles (NeMo Automodel parallel_styles semantics) and translate_to_lora.
#include "parallel/tensor_parallel/style_util.h"

namespace dtr {

void ColwiseParallelLora::apply(nn::Module& m, const std::string& fqn, const DeviceMesh& mesh, DistributeMemo& memo) {
  if (m.type_name() != "LoRALinear") {  // plain Linear / Embedding: the stock behaviour
    ColwiseParallel::apply(m, fqn, mesh, memo);
    return;
  }
  // Every parameter Shard(0): base weight [out, in], bias [out], lora_A [r, in], lora_B [out, r].
  tp::distribute_param(m, "weight", mesh, {Shard(0)}, memo);
  tp::distribute_param(m, "bias", mesh, {Shard(0)}, memo);
  auto a = m.get_submodule("lora_A");
  auto b = m.get_submodule("lora_B");
  tp::distribute_param(*a, "weight", mesh, {Shard(0)}, memo);
  tp::distribute_param(*b, "weight", mesh, {Shard(0)}, memo);
  // lora_A's output is sharded on the rank dim: gather it before lora_B.
  a->register_forward_hook([](nn::Module&, const std::vector<Tensor>&,
                              const std::vector<Tensor>& outs) -> std::optional<std::vector<Tensor>> {
    if (outs.empty() || !outs[0].is_distributed()) return std::nullopt;
    return std::vector<Tensor>{redistribute(outs[0], replicate_all(device_mesh(outs[0]).ndim()))};
  });
  tp::install_input_hook(m, mesh, *input_layout, desired_input_layout, type_name() + " input of '" + fqn + "'");
  tp::install_output_hook(m, output_layout, use_local_output);
}

void RowwiseParallelLora::apply(nn::Module& m, const std::string& fqn, const DeviceMesh& mesh, DistributeMemo& memo) {
  if (m.type_name() != "LoRALinear") {
    RowwiseParallel::apply(m, fqn, mesh, memo);
    return;
  }
  const int64_t in_features = m.parameter("weight").size(1);
  tp::distribute_param(m, "weight", mesh, {Shard(1)}, memo);
  tp::distribute_param(m, "bias", mesh, {Replicate()}, memo);
  tp::distribute_param(*m.get_submodule("lora_A"), "weight", mesh, {Shard(1)}, memo);
  tp::distribute_param(*m.get_submodule("lora_B"), "weight", mesh, {Shard(1)}, memo);
  tp::install_input_hook(m, mesh, *input_layout, Shard(-1), type_name() + " input of '" + fqn + "'", in_features);
  tp::install_output_hook(m, output_layout, use_local_output);
}

void SequenceParallelLora::apply(nn::Module& m, const std::string& fqn, const DeviceMesh& mesh, DistributeMemo& memo) {
  SequenceParallel::apply(m, fqn, mesh, memo);
}

ParallelizePlan& translate_to_lora(ParallelizePlan& plan) {
  for (auto& [key, style] : plan) {
    const std::string t = style->type_name();
    if (t == "ColwiseParallel") {
      style = std::make_shared<ColwiseParallelLora>(static_cast<const ColwiseParallel&>(*style));
    } else if (t == "RowwiseParallel") {
      style = std::make_shared<RowwiseParallelLora>(static_cast<const RowwiseParallel&>(*style));
    } else if (t == "SequenceParallel") {
      style = std::make_shared<SequenceParallelLora>(static_cast<const SequenceParallel&>(*style));
    }
  }
  return plan;
}

}  // namespace dtr
