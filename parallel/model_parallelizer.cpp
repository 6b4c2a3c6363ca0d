#include "parallel/model_parallelizer.h"

#include <map>

#include "parallel/activation_checkpoint.h"
#include "parallel/context_parallel.h"
#include "parallel/ddp.h"
#include "parallel/expert_parallel.h"
#include "parallel/meta_init.h"
#include "dtensor/spec.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/tensor_parallel/plan_from_names.h"
#include "tensor/dispatch.h"
#include "tensor/nn/module_list.h"

namespace dtr {
namespace {
std::map<std::string, ParallelizerFactory>& registry() {
  static std::map<std::string, ParallelizerFactory> r;
  return r;
}

bool is_unsharded(const MeshContext& ctx) {
  return ctx.world_size == 1 || (ctx.dp_size == 1 && ctx.tp_size == 1 && ctx.cp_size == 1);
}

}  // namespace

ParallelizePlan ModelParallelizer::tp_plan(nn::Module& model, const MeshContext& ctx) {
  DTR_ERROR("parallelize_model: no tensor-parallel plan for model type ", model.type_name(),
            " (distributed.tp_size=", ctx.tp_size, "); give distributed.tp_plan or register a ModelParallelizer for it");
}

std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> ModelParallelizer::layers(nn::Module& model) {
  std::string best_fqn;
  std::shared_ptr<nn::Module> best;
  size_t best_n = 0;
  for (auto& [fqn, m] : model.named_modules()) {
    if (m->type_name() != "ModuleList") continue;
    const size_t n = m->children().size();
    if (n > best_n) {
      best_n = n;
      best = m;
      best_fqn = fqn;
    }
  }
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> out;
  if (!best) return out;
  for (auto& [name, child] : best->named_children()) out.push_back({best_fqn + "." + name, child});
  return out;
}

void register_model_parallelizer(const std::string& model_type, ParallelizerFactory f) {
  registry()[model_type] = std::move(f);
}

std::shared_ptr<ModelParallelizer> parallelizer_for(const nn::Module& model) {
  auto it = registry().find(model.type_name());
  if (it != registry().end()) return it->second();
  return std::make_shared<ModelParallelizer>();
}

ParallelizePlan recipe_tp_plan(nn::Module& model, const MeshContext& ctx) {
  ParallelizePlan plan = plan_from_names(ctx.tp_plan, "distributed.tp_plan");
  check_plan_matches(model, plan, "distributed.tp_plan");
  parallelizer_for(model)->check_tp_plan(model, ctx, plan);
  return plan;
}

void parallelize_model(nn::Module& model, const MeshContext& ctx) {
  DTR_CHECK(ctx.mesh != nullptr, "parallelize_model: build_mesh() was not called");
  auto p = parallelizer_for(model);
  auto layer_list = p->layers(model);
  auto apply_ac = [&] {
    if (!ctx.activation_checkpointing) return;
    DTR_CHECK(ctx.activation_checkpointing_scope == "all" || ctx.activation_checkpointing_scope == "layers",
              "distributed.activation_checkpointing_scope=", ctx.activation_checkpointing_scope,
              ": expected all (every decoder layer; 'layers' is a synonym)");
    for (auto& [fqn, layer] : layer_list) checkpoint_module(*layer, *ctx.activation_checkpointing);
  };
  if (ctx.strategy == DataParallelStrategy::ddp) {
    apply_ac();
    materialize_module(model);  // meta-built: DDP replicas are whole (replicate broadcasts them)
    if (ctx.dp_size > 1) replicate(model, ctx.dp_mesh());
    return;
  }
  // dp 1 with a mixed-precision policy: the units are still wrapped (fully_shard on the size-1
  // dp mesh: no dp communication) so that the policy takes effect.
  const bool mp = ctx.mp_policy.any_dtype();
  if (is_unsharded(ctx) && !mp) {
    apply_ac();
    materialize_module(model);
    return;
  }
  // fsdp2
  if (ctx.tp_size > 1) {
    p->validate_tp_mesh(model, ctx.tp_size);
    // The recipe's distributed.tp_plan replaces the sidecar's.
    ParallelizePlan plan = ctx.tp_plan.empty() ? p->tp_plan(model, ctx) : recipe_tp_plan(model, ctx);
    translate_to_lora(plan);
    parallelize_module(model, ctx.tp_mesh(), plan);
    p->after_tp(model, ctx);
  }
  // Expert parallelism (Automodel's order: TP, EP, AC, FSDP): experts Shard(0) over ep, tokens
  // moved by all-to-all; their FSDP below runs over the rest of the dp ranks.
  if (ctx.ep_size > 1) {
    DTR_CHECK(apply_expert_parallel(model, ctx.ep_mesh()) > 0, "parallelize_model: distributed.ep_size=", ctx.ep_size,
              " but the ", model.type_name(), " model has no MoE block");
  }
  // Context parallelism: attention layers run on sequence slices with K/V gathered over cp.
  if (ctx.cp_size > 1) {
    DTR_CHECK(apply_context_parallel(model, ctx.cp_mesh()) > 0, "parallelize_model: distributed.cp_size=", ctx.cp_size,
              " but the ", model.type_name(), " model has no context-parallel attention");
  }
  apply_ac();
  // FSDP over dp_shard_cp: cp ranks hold other tokens, so their gradients are averaged too.
  if (ctx.dp_size * ctx.cp_size == 1 && !mp) {
    materialize_module(model);  // TP only: each rank fills its TP shards
    return;
  }
  FSDPOptions opt;
  opt.mp_policy = ctx.mp_policy;
  opt.offload_policy = ctx.offload_policy;
  opt.forward_prefetch_depth = ctx.enable_fsdp2_prefetch ? ctx.fsdp2_forward_prefetch_depth : 0;
  opt.backward_prefetch_depth = ctx.enable_fsdp2_prefetch ? ctx.fsdp2_backward_prefetch_depth : 0;
  // dp x tp: FSDP + TP on the (dp_shard_cp, tp) mesh ((dp_replicate, dp_shard_cp, tp) with HSDP).
  const DeviceMesh mesh = ctx.tp_size > 1 ? ctx.fsdp_tp_mesh() : ctx.fsdp_mesh();
  for (size_t i = 0; i < layer_list.size(); ++i) {
    FSDPOptions o = opt;
    o.reshard_after_forward = ctx.reshard_after_forward.value_or(i + 1 != layer_list.size());
    if (ctx.ep_size > 1) {
      // The experts: own unit on (ep_shard, ep); their gradients were summed over ep by the
      // all-to-all backward and over ep_shard (and dp_replicate) by FSDP: divide by the whole dp.
      FSDPOptions eo = o;
      eo.gradient_divide_factor = static_cast<double>(ctx.dp_size);
      for (const auto& moe : nn::moe_modules(*layer_list[i].second))
        fully_shard(*moe->experts(), ctx.expert_fsdp_mesh(), eo);
    }
    fully_shard(*layer_list[i].second, mesh, o);
  }
  // An extra unit the TP plan left plain (e.g. an untied lm_head outside distributed.tp_plan) is
  // replicated over tp: FSDP over the dp dims only, as FSDP2's fully_shard(unit, mesh[dp dims]).
  auto has_tp_param = [](nn::Module& m) {
    for (auto& [n, t] : m.named_parameters())
      if (t.is_distributed()) return true;
    return false;
  };
  for (auto& [fqn, m] : p->extra_units(model)) {
    FSDPOptions o = opt;
    o.reshard_after_forward = ctx.reshard_after_forward.value_or(false);
    fully_shard(*m, ctx.tp_size > 1 && !has_tp_param(*m) ? ctx.fsdp_mesh() : mesh, o);
  }
  FSDPOptions root = opt;
  root.reshard_after_forward = false;
  fully_shard(model, mesh, root);
  materialize_module(model);  // fully_shard filled the shards; anything left (buffers)
}

void set_model_gradient_sync(nn::Module& model, const MeshContext& ctx, bool last_micro_batch) {
  const bool sync = last_micro_batch || !ctx.defer_fsdp_grad_sync;
  if (ctx.strategy == DataParallelStrategy::ddp) {
    if (ctx.dp_size > 1) replicate_set_requires_gradient_sync(model, sync);
    return;
  }
  if (is_fully_sharded(model)) set_requires_gradient_sync(model, sync);
}

}  // namespace dtr
