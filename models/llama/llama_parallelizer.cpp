#include "models/llama/llama_parallelizer.h"

#include "models/llama/llama.h"

namespace dtr {

ParallelizePlan LlamaParallelizer::tp_plan(nn::Module& model, const MeshContext& ctx) {
  ParallelizePlan plan;
  const std::string L = "model.layers.*.";
  if (!ctx.sequence_parallel) {
    plan.push_back({"model.embed_tokens", std::make_shared<RowwiseParallel>(Replicate(), Replicate())});
    for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"})
      plan.push_back({L + n, std::make_shared<ColwiseParallel>()});
    for (const char* n : {"self_attn.o_proj", "mlp.down_proj"}) plan.push_back({L + n, std::make_shared<RowwiseParallel>()});
    plan.push_back({"lm_head", std::make_shared<ColwiseParallel>(Replicate(), Shard(-1), false)});
    return plan;
  }
  plan.push_back({"model.embed_tokens", std::make_shared<RowwiseParallel>(Replicate(), Shard(1))});
  for (const char* n : {"input_layernorm", "post_attention_layernorm"}) {
    auto sp = std::make_shared<SequenceParallel>(1, false);
    sp->output_layout = Replicate();  // gather the normalised activations once for q/k/v (gate/up)
    plan.push_back({L + n, sp});
  }
  for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"})
    plan.push_back({L + n, std::make_shared<ColwiseParallel>()});
  for (const char* n : {"self_attn.o_proj", "mlp.down_proj"})
    plan.push_back({L + n, std::make_shared<RowwiseParallel>(std::nullopt, Shard(1))});
  plan.push_back({"model.norm", std::make_shared<SequenceParallel>(1, false)});
  plan.push_back({"lm_head", std::make_shared<ColwiseParallel>(Shard(1), Shard(-1), false)});
  (void)model;
  return plan;
}

void LlamaParallelizer::validate_tp_mesh(nn::Module& model, int64_t tp) {
  auto& m = dynamic_cast<LlamaForCausalLM&>(model);
  const auto& c = m.config();
  const int64_t kv = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  DTR_CHECK(c.num_attention_heads % tp == 0 && kv % tp == 0, "distributed.tp_size=", tp,
            " does not divide num_attention_heads=", c.num_attention_heads, " and num_key_value_heads=", kv,
            " of the model");
}

std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> LlamaParallelizer::extra_units(nn::Module& model) {
  auto& m = dynamic_cast<LlamaForCausalLM&>(model);
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> out;
  if (m.tied()) return out;  // tied tables live in the root unit
  for (const char* fqn : {"model.embed_tokens", "lm_head"}) {
    auto sub = model.get_submodule(fqn);
    bool trainable = false;
    for (auto& [n, p] : sub->named_parameters()) trainable = trainable || p.requires_grad();
    if (trainable) out.push_back({fqn, sub});
  }
  return out;
}

DTR_REGISTER_MODEL_PARALLELIZER("LlamaForCausalLM", LlamaParallelizer);

}  // namespace dtr
