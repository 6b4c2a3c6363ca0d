#pragma once
// ModelParallelizer: the per-model sidecar that says how a model is parallelized (its TP plan,
// how layers group into FSDP / activation-checkpoint units, TP mesh validation), a registry so
// that a model type owns its parallelizer, and parallelize_model, which dispatches on the
// strategy. Source: NeMo Automodel model_parallelizer.py / parallelizer.py (order of steps).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/mesh_context.h"
#include "parallel/tensor_parallel/style.h"
#include "tensor/dispatch.h"
#include "tensor/nn/module.h"

namespace dtr {

/// Default behaviour for any model; models override what they know better.
class ModelParallelizer {
 public:
  virtual ~ModelParallelizer() = default;
  /// The TP plan (module FQN patterns -> styles). Default: error (no plan for this model).
  virtual ParallelizePlan tp_plan(nn::Module& model, const MeshContext& ctx);
  /// Checks that the model can be split tp ways (e.g. heads % tp). Default: no check.
  virtual void validate_tp_mesh(nn::Module& model, int64_t tp_size) {}
  /// Checks a plan the recipe gave (distributed.tp_plan) against what the model needs (e.g. kv
  /// heads that cannot be split). Default: no check.
  virtual void check_tp_plan(nn::Module& model, const MeshContext& ctx, const ParallelizePlan& plan) {}
  /// After TP: re-tie weights, rewrite local head counts. Default: nothing.
  virtual void after_tp(nn::Module& model, const MeshContext& ctx) {}
  /// The repeated layers (FSDP units and activation-checkpoint units), with FQNs. Default: the
  /// children of the largest ModuleList in the tree.
  virtual std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> layers(nn::Module& model);
  /// Modules (FQN) that get their own FSDP unit besides the layers: trainable, untied input /
  /// output embeddings, so one reduce-scatter buffer never holds both tables. Default: none.
  virtual std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> extra_units(nn::Module& model) { return {}; }
};

using ParallelizerFactory = std::function<std::shared_ptr<ModelParallelizer>()>;
/// Registers the parallelizer of models whose root module has type_name() == `model_type`.
void register_model_parallelizer(const std::string& model_type, ParallelizerFactory f);
/// The registered parallelizer for `model`, or the default one.
std::shared_ptr<ModelParallelizer> parallelizer_for(const nn::Module& model);

/// The plan of ctx.tp_plan (the recipe's distributed.tp_plan) for `model`, checked: every pattern
/// matches a module, and the model's parallelizer accepts it (check_tp_plan). Needs no mesh and
/// no communication, so callers can check a recipe before parallelize_model. Errors: unknown
/// style names, unmatched patterns, what check_tp_plan raises.
ParallelizePlan recipe_tp_plan(nn::Module& model, const MeshContext& ctx);

/// Parallelizes `model` in place on ctx.mesh (build_mesh() must have run):
///  - world (or mesh) size 1: activation checkpointing only (unsharded), unless ctx.mp_policy
///    sets a dtype: then fully_shard on the size-1 dp mesh applies it (as for TP only, dp 1);
///  - fsdp2: TP (the sidecar's plan, or ctx.tp_plan when the recipe gives one: every pattern must
///    match a module; translated to LoRA styles) -> activation checkpointing (full or selective,
///    every layer) -> fully_shard per
///    layer (reshard_after_forward true except the last layer, unless set explicitly) ->
///    extra units (untied trainable embeddings) -> root (not resharded);
///  - ddp: activation checkpointing, then replicate on the dp mesh.
///  - fsdp2 with ep_size > 1 (expert parallelism): after TP, the experts of every nn::MoE are
///    sharded Shard(0) over ctx.ep_mesh() (apply_expert_parallel: tokens move by all-to-all),
///    then AC, then per layer its experts get their own unit on ctx.expert_fsdp_mesh()
///    ((ep_shard, ep); gradients divided by the whole dp size) before the layer's unit on the
///    dp mesh takes the rest. Errors: no MoE block in the model, num_experts % ep_size != 0.
///  - fsdp2 with cp_size > 1 (context parallelism): after TP (and EP), apply_context_parallel on
///    ctx.cp_mesh() (the model's attention layers then take load-balanced sequence slices), and
///    fully_shard runs over dp_shard_cp (HSDP: (dp_replicate, dp_shard_cp)), also with dp 1.
///    Errors: no ContextParallelModule in the model.
///  - fsdp2 with dp > 1 and tp > 1: TP, then FSDP + TP: the same fully_shard units on the
///    (dp_shard_cp, tp) mesh (ctx.fsdp_tp_mesh(); HSDP: (dp_replicate, dp_shard_cp, tp)), the TP
///    DTensors sharded over dp (StridedShard(0, tp) when TP splits dim 0).
/// A model built under MetaInitGuard (tensor/meta.h) is materialised here: TP keeps local shards
/// meta, fully_shard fills each rank's rows from the recipe, and materialize_module fills what is
/// left (unsharded / TP-only / DDP tensors), so no rank ever holds a full copy of a sharded
/// parameter and no TP parameter is broadcast.
/// Errors: whatever validate_tp_mesh / tp_plan / check_tp_plan raise; a ctx.tp_plan pattern that
/// matches no module.
void parallelize_model(nn::Module& model, const MeshContext& ctx);

/// Gradient accumulation: call before each micro-batch's backward. The backward of the last
/// micro-batch of a step reduces the gradients; earlier ones keep them local (unsharded, summed)
/// when ctx.defer_fsdp_grad_sync (default), or reduce them too (reduce-scatter into the sharded
/// .grad every micro-batch) when it is false.
void set_model_gradient_sync(nn::Module& model, const MeshContext& ctx, bool last_micro_batch);

#define DTR_REGISTER_MODEL_PARALLELIZER(type, cls) \
  static const bool DTR_CONCAT(dtr_par_reg_, __LINE__) = \
      (::dtr::register_model_parallelizer(type, [] { return std::make_shared<cls>(); }), true)

}  // namespace dtr
