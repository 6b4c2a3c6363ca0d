#include "models/transformer/parallelizer.h"

#include "models/transformer/causal_lm.h"
#include "models/transformer/pipeline_stage.h"
#include "parallel/tensor_parallel/kv_replicate.h"

namespace dtr {

void check_tp_heads(const ModelConfig& c, int64_t tp, const std::string& source) {
  const int64_t kv = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  DTR_CHECK(c.num_attention_heads % tp == 0, "distributed.tp_size=", tp, " does not divide num_attention_heads=",
            c.num_attention_heads, " (", source, ")");
  DTR_CHECK(kv % tp == 0 || tp % kv == 0, "distributed.tp_size=", tp, " neither divides num_key_value_heads=", kv,
            " nor is a multiple of it (kv heads are split or replicated whole) (", source, ")");
}

namespace {

/// The config of a whole causal LM or of one of its pipeline stages.
const ModelConfig& decoder_config(nn::Module& model) {
  if (auto* m = dynamic_cast<CausalLM*>(&model)) return m->config();
  if (auto* s = dynamic_cast<CausalLMStage*>(&model)) return s->config();
  DTR_ERROR("DecoderParallelizer: ", model.type_name(), " is neither a CausalLM nor a CausalLMStage");
}

/// A pipeline stage holds the embedding (first) and the final norm and lm_head (last) only.
bool holds(nn::Module& model, const std::string& fqn) {
  auto* s = dynamic_cast<CausalLMStage*>(&model);
  if (!s) return true;
  if (fqn == "model.embed_tokens") return s->is_first();
  if (fqn == "model.norm" || fqn == "lm_head") return s->is_last();
  return true;
}

}  // namespace

ParallelizePlan DecoderParallelizer::tp_plan(nn::Module& model, const MeshContext& ctx) {
  const ModelConfig& c = decoder_config(model);
  const int64_t kv = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  const bool replicate_kv = ctx.tp_size > kv;
  const bool sp = ctx.sequence_parallel;
  const std::string L = "model.layers.*.";
  ParallelizePlan plan;
  auto gathered_norm = [&](const char* n) {  // SP norm whose output feeds colwise projections
    auto s = std::make_shared<SequenceParallel>(1, false);
    s->output_layout = Replicate();  // gather the normalised activations once for q/k/v (gate/up)
    plan.push_back({L + n, s});
  };
  plan.push_back({"model.embed_tokens", std::make_shared<RowwiseParallel>(Replicate(), sp ? Shard(1) : Replicate())});
  if (sp) {
    gathered_norm("input_layernorm");
    if (c.sandwich_norms) {
      // After attention / the MLP: sequence shards in and out, local like the residual stream.
      plan.push_back({L + "post_attention_layernorm", std::make_shared<SequenceParallel>(1, true)});
      gathered_norm("pre_feedforward_layernorm");
      plan.push_back({L + "post_feedforward_layernorm", std::make_shared<SequenceParallel>(1, true)});
    } else {
      gathered_norm("post_attention_layernorm");
    }
  }
  plan.push_back({L + "self_attn.q_proj", std::make_shared<ColwiseParallel>()});
  for (const char* n : {"self_attn.k_proj", "self_attn.v_proj"}) {
    if (replicate_kv) plan.push_back({L + n, std::make_shared<KVReplicateParallel>(kv)});
    else plan.push_back({L + n, std::make_shared<ColwiseParallel>()});
  }
  if (c.qk_norm)  // [B, T, local heads, D]: weights replicated, heads dim sharded
    for (const char* n : {"self_attn.q_norm", "self_attn.k_norm"})
      plan.push_back({L + n, std::make_shared<SequenceParallel>(2, true)});
  for (const char* n : {"mlp.gate_proj", "mlp.up_proj"}) plan.push_back({L + n, std::make_shared<ColwiseParallel>()});
  for (const char* n : {"self_attn.o_proj", "mlp.down_proj"})
    plan.push_back({L + n, sp ? std::make_shared<RowwiseParallel>(std::nullopt, Shard(1))
                              : std::make_shared<RowwiseParallel>()});
  if (sp) plan.push_back({"model.norm", std::make_shared<SequenceParallel>(1, false)});
  plan.push_back({"lm_head", std::make_shared<ColwiseParallel>(sp ? Shard(1) : Replicate(), Shard(-1), false)});
  std::erase_if(plan, [&](const auto& e) { return !holds(model, e.first); });
  return plan;
}

void DecoderParallelizer::validate_tp_mesh(nn::Module& model, int64_t tp) {
  check_tp_heads(decoder_config(model), tp, "model " + model.type_name());
}

void DecoderParallelizer::check_tp_plan(nn::Module& model, const MeshContext& ctx, const ParallelizePlan& plan) {
  const ModelConfig& c = dynamic_cast<CausalLM&>(model).config();
  const int64_t kv = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  // The style the plan gives the first layer's `name` ("" when none).
  auto style_of = [&](const std::string& name) {
    std::string t;
    for (const auto& [pattern, style] : plan)
      if (fqn_matches(pattern, "model.layers.0." + name)) t = style->type_name();
    return t;
  };
  for (const char* n : {"self_attn.k_proj", "self_attn.v_proj"})
    DTR_CHECK(!(ctx.tp_size > kv && style_of(n) == "ColwiseParallel"), "distributed.tp_plan: ", n,
              " colwise with distributed.tp_size=", ctx.tp_size, " > num_key_value_heads=", kv,
              " would split a kv head; leave tp_plan unset (the ", model.type_name(),
              " parallelizer replicates kv heads) or keep tp_size <= ", kv);
  if (c.qk_norm && style_of("self_attn.q_proj") == "ColwiseParallel")
    for (const char* n : {"self_attn.q_norm", "self_attn.k_norm"})
      DTR_CHECK(!style_of(n).empty(), "distributed.tp_plan: model.layers.*.", n,
                " needs an entry (replicated_with_grad_allreduce): its input holds this rank's heads only, so its "
                "gradient must be reduced over tp");
}

std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> DecoderParallelizer::extra_units(nn::Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> out;
  if (decoder_config(model).tie_word_embeddings) return out;  // tied tables live in the root unit
  for (const char* fqn : {"model.embed_tokens", "lm_head"}) {
    if (!holds(model, fqn)) continue;
    auto sub = model.get_submodule(fqn);
    bool trainable = false;
    for (auto& [n, p] : sub->named_parameters()) trainable = trainable || p.requires_grad();
    if (trainable) out.push_back({fqn, sub});
  }
  return out;
}

}  // namespace dtr
