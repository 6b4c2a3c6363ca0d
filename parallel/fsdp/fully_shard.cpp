// fully_shard scheduling: root detection, forward / backward hooks, prefetch, the end of
// backward (see fully_shard.h).
#include "parallel/fsdp/fully_shard.h"

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>

#include "dtensor/api.h"
#include "parallel/ddp.h"
#include "parallel/activation_checkpoint.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

struct FSDPContext;

/// One fully_shard unit: its param group and per-iteration state, stored on the module
/// (nn::Module::state<FSDPState>()).
struct FSDPState : nn::ModuleState, std::enable_shared_from_this<FSDPState> {
  static constexpr const char* kKey = "fully_shard";
  nn::Module* module = nullptr;
  std::string label;
  FSDPOptions opt;
  std::unique_ptr<FSDPParamGroup> group;
  bool is_root = false;
  bool requires_sync = true;
  bool hooks_enabled = true;  // false: the pipeline schedule drives the unit (set_fsdp_hooks_enabled)
  std::shared_ptr<FSDPContext> ctx;
  // per iteration
  std::vector<bool> ready;
  int n_ready = 0;
  bool post_backward_done = false;
  bool pre_backward_done = false;
  int input_hooks_pending = 0;
  bool input_hooks_registered = false;

  void pre_forward(std::vector<Tensor>& inputs);
  void post_forward(std::vector<Tensor>& outputs);
  void pre_backward();
  void on_grad_ready(int idx);
  void post_backward();
  void maybe_reshard_after_backward();
  void become_root();
  void queue_post_backward_callback();
};

/// Shared by a root and the units below it.
struct FSDPContext {
  std::vector<FSDPState*> units;  // pre-order
  std::vector<FSDPState*> fwd_prev, fwd_cur, post_fwd;
  std::vector<FSDPState*> pending;  // units with a reduction in flight, in issue order (at most 2)
  bool finalized = true;
  uint64_t callback_backward_id = 0;  // the backward the post-backward callback is queued for

  /// FSDP2's bound on the reductions in flight, run before a unit packs its gradients for the
  /// reduce-scatter (_fsdp_param_group.py post_backward waits for the previous reduce_scatter_state
  /// there): the previous unit's reduce-scatter is waited for, which frees its input (the flat
  /// unsharded gradients); without HSDP its shards are added into .grad at once, under HSDP its
  /// all-reduce is issued and overlaps this unit's backward, and the all-reduce issued at the call
  /// before is waited for and applied. So at most one reduce-scatter input is alive besides the
  /// new unit's gradients, and one all-reduce is in flight.
  void bound_reductions() {
    std::vector<FSDPState*> keep;
    for (FSDPState* s : pending) {
      FSDPParamGroup& g = *s->group;
      if (g.reduce_scatter_in_flight()) {
        g.finish_reduce_scatter();
        if (g.all_reduce_in_flight()) {
          keep.push_back(s);
          continue;
        }
      }
      g.finish_reduce_apply();
    }
    pending = std::move(keep);
  }
  /// Waits for the reductions left in issue order (reduce-scatters first, then HSDP all-reduces
  /// and the accumulation into .grad).
  void wait_reductions() {
    for (FSDPState* s : pending) s->group->finish_reduce_scatter();
    for (FSDPState* s : pending) s->group->finish_reduce_apply();
    pending.clear();
  }
  /// Called after a unit's post-backward: when every trainable unit that ran forward is done,
  /// the backward's reductions are complete.
  void maybe_finalize() {
    for (FSDPState* s : fwd_cur)
      if (s->group->num_trainable() > 0 && !s->post_backward_done) return;
    wait_reductions();
    finalized = true;
  }
  /// Everything left: reduce incomplete units, wait, drop prefetches, reshard all. A unit still
  /// unsharded here (the root; a unit whose frozen parameters waited for the end of backward,
  /// like the first layer under LoRA) keeps its frozen parameters gathered: they are alive at
  /// this point anyway, and the next forward, which needs them first thing, then gathers only
  /// the parameters the optimizer can have changed (FSDPParamGroup::reshard(true)).
  void finish(bool reduce_incomplete) {
    if (reduce_incomplete)
      for (FSDPState* s : fwd_cur)
        if (s->group->num_trainable() > 0 && !s->post_backward_done && s->n_ready > 0) s->post_backward();
    wait_reductions();
    for (FSDPState* s : units) {
      s->group->drop_gather();
      s->group->reshard(/*keep_frozen=*/true);
    }
    finalized = true;
  }
};

/// Plain parameters claimed by a unit (weak: a tensor still alive elsewhere is a tied weight)
/// and the DTensors fully_shard made.
struct Claim {
  std::weak_ptr<TensorImpl> impl;
  std::string desc;
};
std::unordered_map<const TensorImpl*, Claim>& claimed_originals() {
  static std::unordered_map<const TensorImpl*, Claim> r;
  return r;
}
std::unordered_map<const TensorImpl*, std::weak_ptr<TensorImpl>>& fsdp_dtensors() {
  static std::unordered_map<const TensorImpl*, std::weak_ptr<TensorImpl>> r;
  return r;
}

FSDPState* state_of(const nn::Module* m) { return m->state<FSDPState>(); }

bool is_fsdp_dtensor(const Tensor& t) {
  auto it = fsdp_dtensors().find(t.impl());
  return it != fsdp_dtensors().end() && it->second.lock() == t.impl_ptr();
}

void check_dtype(std::optional<DType> dt, const char* what) {
  if (!dt) return;
  DTR_CHECK(*dt == DType::f32 || *dt == DType::f64 || *dt == DType::bf16 || *dt == DType::f16,
            "fully_shard: MixedPrecisionPolicy.", what, " = ", *dt, " is not supported (expected f32, f64, bf16 or f16)");
}

/// FSDP + TP: a DTensor parameter must live on a 1-d mesh equal to the last dim of the
/// fully_shard mesh (whatever its name: "tp", "model", "ep", ...) and be Shard or Replicate there.
void check_tp_param(const std::string& label, const std::string& fqn, const Tensor& t, const DeviceMesh& mesh) {
  const DTensorSpec& s = dtensor_spec(t, "fully_shard");
  DTR_CHECK(mesh.ndim() == 2 || mesh.ndim() == 3, "fully_shard(", label, "): parameter \"", fqn,
            "\" is already a DTensor (", s.str(), "); for FSDP + TP pass the (dp_shard, tp) mesh (or ",
            "(dp_replicate, dp_shard, tp)) whose last dim is the parameter's mesh, got ", mesh.str());
  const std::string inner = mesh.dim_names().back();  // "tp", "ep" (expert parallelism), any name
  for (int i = 0; i + 1 < mesh.ndim(); ++i)
    DTR_CHECK(!(s.mesh == mesh[mesh.dim_names()[i]]), "fully_shard(", label, "): parameter \"", fqn, "\" lives on ",
              s.mesh.str(), ", dim ", i, " of the fully_shard mesh ", mesh.str(), "; FSDP + TP expects a (dp_shard, ",
              "tp) or (dp_replicate, dp_shard, tp) mesh with tp last (the parameters' mesh as the last dim)");
  DTR_CHECK(s.mesh.ndim() == 1 && s.mesh == mesh[inner], "fully_shard(", label, "): FSDP + ", inner,
            " mesh dims do not match: parameter \"", fqn, "\" lives on ", s.mesh.str(), " but the fully_shard mesh's ",
            inner, " dim is ", mesh[inner].str(), " (full mesh ", mesh.str(), ")");
  DTR_CHECK(s.placements[0].is_shard() || s.placements[0].is_replicate(), "fully_shard(", label, "): parameter \"",
            fqn, "\" has TP placement ", s.placements[0].str(), "; FSDP + TP needs Shard or Replicate");
}

/// PyTorch's FSDP2 call: `mesh` holds only the dp dims and the unit's TP DTensor parameters live
/// on another 1-d sub-mesh of the same constructed mesh: the unit's mesh is that mesh's (dp dims...,
/// tp dim) (FSDP2 takes the root mesh of both likewise). Otherwise `mesh` itself (the full-mesh
/// call, or meshes check_tp_param refuses).
DeviceMesh unit_mesh(nn::Module& module, const DeviceMesh& mesh) {
  for (auto& [fqn, t] : module.named_parameters("", true, /*remove_duplicate=*/false)) {
    if (!t.is_distributed() || is_fsdp_dtensor(t)) continue;
    const DeviceMesh& tp = dtensor_spec(t, "fully_shard").mesh;
    if (tp.ndim() != 1 || !tp.shares_root(mesh) || mesh.ndim() > 2) return mesh;
    for (const auto& n : mesh.dim_names())
      if (n == tp.dim_names()[0]) return mesh;  // the tp dim is part of `mesh`
    std::vector<std::string> names = mesh.dim_names();
    names.push_back(tp.dim_names()[0]);
    return mesh.root_mesh()[names];
  }
  return mesh;
}

/// FSDP + TP is recognised from the parameters' own meshes, never from dim names: a unit with a
/// DTensor parameter (checked by check_tp_param) is laid out (dp..., tp). A unit of plain
/// parameters takes the layout of a unit below it on the same mesh (the root after its TP
/// layers); otherwise the mesh is (shard) or (replicate, shard).
bool unit_is_tp_layout(nn::Module& module, const std::vector<std::pair<std::vector<std::string>, Tensor>>& params,
                       const DeviceMesh& mesh) {
  for (const auto& p : params)
    if (p.second.is_distributed()) return true;
  for (auto& [fqn, m] : module.named_modules()) {
    if (m.get() == &module) continue;
    const FSDPParamGroup* g = fsdp_param_group(*m);
    if (g && g->tp_layout() && g->mesh() == mesh) return true;
  }
  return false;
}

int index_of(const std::vector<FSDPState*>& v, const FSDPState* s) {
  auto it = std::find(v.begin(), v.end(), s);
  return it == v.end() ? -1 : static_cast<int>(it - v.begin());
}

// ---- FSDPState -------------------------------------------------------------------------------

void FSDPState::become_root() {
  auto c = std::make_shared<FSDPContext>();
  for (auto& [name, m] : module->named_modules()) {
    FSDPState* s = state_of(m.get());
    if (!s) continue;
    c->units.push_back(s);
    s->ctx = c;
    s->is_root = s == this;
  }
}

void FSDPState::pre_forward(std::vector<Tensor>& inputs) {
  if (!hooks_enabled) return;
  if (!ctx) become_root();
  if (is_root) {
    // A new iteration: finish leftovers of the previous one (no new reductions), reset.
    ctx->finish(/*reduce_incomplete=*/false);
    if (!ctx->fwd_cur.empty()) ctx->fwd_prev = ctx->fwd_cur;
    ctx->fwd_cur.clear();
    ctx->post_fwd.clear();
    ctx->finalized = false;
  }
  group->sync_requires_grad();  // requires_grad changed since the last forward (FSDP2 honours it)
  ready.assign(group->params().size(), false);
  n_ready = 0;
  post_backward_done = false;
  pre_backward_done = false;
  input_hooks_pending = 0;
  input_hooks_registered = false;
  ctx->fwd_cur.push_back(this);

  group->unshard_async();
  group->wait_unshard();
  // Forward prefetch: the next units in last iteration's forward order.
  const int i = index_of(ctx->fwd_prev, this);
  if (i >= 0)
    for (int k = 1; k <= opt.forward_prefetch_depth && i + k < static_cast<int>(ctx->fwd_prev.size()); ++k)
      ctx->fwd_prev[i + k]->group->unshard_async();

  // A checkpointed module runs its forward with grad off (its pre-hook ran first); the cast and
  // the input hooks must still connect to the caller's graph.
  GradModeGuard track(grad_enabled() || is_checkpointed(*module));
  const auto& mp = opt.mp_policy;
  if (mp.cast_forward_inputs && mp.param_dtype)
    for (Tensor& x : inputs)
      if (x.defined() && is_floating(x.dtype()) && x.dtype() != *mp.param_dtype) x = x.to(*mp.param_dtype);

  // Post-backward signal for resharding: the gradients of the unit's inputs are complete only
  // after every node of the unit that leads to them ran.
  if (grad_enabled()) {
    std::weak_ptr<FSDPState> w = weak_from_this();
    for (const Tensor& x : inputs) {
      if (!x.defined() || !x.requires_grad() || x.is_leaf()) continue;
      ++input_hooks_pending;
      x.register_hook([w](const Tensor&) {
        if (auto s = w.lock()) {
          --s->input_hooks_pending;
          s->maybe_reshard_after_backward();
        }
        return Tensor();
      });
    }
    input_hooks_registered = input_hooks_pending > 0;
  }
}

void FSDPState::post_forward(std::vector<Tensor>& outputs) {
  if (!hooks_enabled) return;
  ctx->post_fwd.push_back(this);
  if (!is_root && opt.reshard_after_forward) group->reshard();
  if (is_root && opt.mp_policy.output_dtype)
    for (Tensor& y : outputs)
      if (y.defined() && is_floating(y.dtype()) && y.dtype() != *opt.mp_policy.output_dtype)
        y = y.to(*opt.mp_policy.output_dtype);
  if (!grad_enabled()) return;
  std::weak_ptr<FSDPState> w = weak_from_this();
  for (const Tensor& y : outputs) {
    if (!y.defined() || !y.requires_grad() || y.is_leaf()) continue;
    y.register_hook([w](const Tensor&) {
      if (auto s = w.lock()) s->pre_backward();
      return Tensor();
    });
  }
}

/// FSDP2's post-backward final callback: the first hook of a unit in a backward queues, once for
/// the root's context, ctx->finish at the end of the outermost backward (autograd
/// queue_callback), so every unit is reduced (missing gradients = zero), waited for and
/// resharded after loss.backward() without a call from the user.
void FSDPState::queue_post_backward_callback() {
  const uint64_t id = current_backward_id();
  if (!hooks_enabled || !ctx || id == 0 || ctx->callback_backward_id == id) return;
  ctx->callback_backward_id = id;
  std::weak_ptr<FSDPContext> w = ctx;
  queue_callback([w] {
    if (auto c = w.lock()) c->finish(/*reduce_incomplete=*/true);
  });
}

void FSDPState::pre_backward() {
  if (!ctx) return;
  queue_post_backward_callback();
  if (pre_backward_done) return;
  pre_backward_done = true;
  group->unshard_async();
  group->wait_unshard();
  // Backward prefetch: the next units in backward order (reverse post-forward order).
  const auto& order = ctx->post_fwd;
  const int i = index_of(order, this);
  if (i < 0) return;
  for (int k = 1; k <= opt.backward_prefetch_depth && i - k >= 0; ++k) {
    FSDPState* s = order[i - k];
    if (!s->post_backward_done) s->group->unshard_async();
  }
}

void FSDPState::on_grad_ready(int idx) {
  if (!hooks_enabled || !ctx || post_backward_done || ready.empty()) return;
  queue_post_backward_callback();
  if (!ready[idx]) {
    ready[idx] = true;
    ++n_ready;
  }
  if (n_ready == group->num_trainable()) {
    post_backward();
    ctx->maybe_finalize();
  }
}

void FSDPState::post_backward() {
  post_backward_done = true;
  if (requires_sync) {
    if (group->num_trainable() > 0) ctx->bound_reductions();
    group->reduce_grads_async();
    if (group->reduce_pending()) ctx->pending.push_back(this);
  } else {
    group->accumulate_unsynced();
  }
  maybe_reshard_after_backward();
}

void FSDPState::maybe_reshard_after_backward() {
  // Safe once no node of the unit can still read its parameters: trainable grads all done (or
  // none) and the inputs' gradients complete. Without input hooks a unit holding frozen
  // parameters waits for finish (a frozen weight may still be read for an input gradient).
  const bool params_done = group->num_trainable() == 0 ? input_hooks_registered : post_backward_done;
  if (!params_done || input_hooks_pending > 0) return;
  const bool has_frozen = static_cast<int>(group->params().size()) > group->num_trainable();
  if (has_frozen && !input_hooks_registered) return;
  group->reshard();
}

}  // namespace

// ---- public API --------------------------------------------------------------------------------

void fully_shard(nn::Module& module, const DeviceMesh& dp_or_full_mesh, const FSDPOptions& options) {
  const std::string label = module.type_name();
  DTR_CHECK(!state_of(&module), "fully_shard: called twice on the same ", label, " module");
  DTR_CHECK(!module.composable_state("replicate"), "fully_shard: replicate was already applied to this ", label,
            " module (a module takes one data-parallel strategy: replicate or fully_shard)");
  const DeviceMesh mesh = unit_mesh(module, dp_or_full_mesh);
  DTR_CHECK(options.forward_prefetch_depth >= 0 && options.backward_prefetch_depth >= 0, "fully_shard(", label,
            "): prefetch depths must be >= 0 (forward ", options.forward_prefetch_depth, ", backward ",
            options.backward_prefetch_depth, ")");
  check_dtype(options.mp_policy.param_dtype, "param_dtype");
  check_dtype(options.mp_policy.reduce_dtype, "reduce_dtype");
  check_dtype(options.mp_policy.output_dtype, "output_dtype");

  // Claim: every parameter (tied names grouped) not already a fully_shard DTensor.
  std::vector<std::pair<std::vector<std::string>, Tensor>> params;
  std::map<const TensorImpl*, size_t> index;
  for (auto& [fqn, t] : module.named_parameters("", true, /*remove_duplicate=*/false)) {
    if (is_fsdp_dtensor(t)) continue;
    DTR_CHECK(!is_replicated_parameter(t), "fully_shard(", label, "): parameter \"", fqn, "\" belongs to a module ",
              "that replicate was applied to (an enclosing module); a parameter takes one data-parallel strategy: ",
              "replicate or fully_shard");
    auto c = claimed_originals().find(t.impl());
    if (c != claimed_originals().end() && c->second.impl.lock() == t.impl_ptr())
      DTR_ERROR("fully_shard(", label, "): parameter \"", fqn, "\" is shared with ", c->second.desc,
                ", which another fully_shard unit already claimed; tied weights must live in one unit "
                "(apply fully_shard to a module that contains both)");
    if (t.is_distributed()) check_tp_param(label, fqn, t, mesh);
    DTR_CHECK(t.dim() >= 1, "fully_shard(", label, "): parameter \"", fqn, "\" is 0-d; Shard(0) needs dim >= 1");
    DTR_CHECK(t.is_leaf(), "fully_shard(", label, "): parameter \"", fqn, "\" is not a leaf");
    DTR_CHECK(!options.offload_policy.enabled || t.device().is_cpu(), "fully_shard(", label, "): OffloadPolicy with ",
              "parameter \"", fqn, "\" on ", t.device().str(), ": CPU offload of device parameters is not built yet ",
              "(for CPU parameters the policy holds as they are: shards, gradients and optimizer state in host memory)");
    auto it = index.find(t.impl());
    if (it != index.end()) {
      params[it->second].first.push_back(fqn);
      continue;
    }
    index[t.impl()] = params.size();
    params.push_back({{fqn}, t});
  }
  const bool tp_layout = unit_is_tp_layout(module, params, mesh);
  DTR_CHECK(tp_layout || mesh.ndim() == 1 || mesh.ndim() == 2, "fully_shard(", label, "): expected a 1-d (shard) or ",
            "2-d (replicate, shard) mesh, got ", mesh.ndim(), " dims ", mesh.str(),
            " (a 3-d (replicate, shard, tp) mesh needs tensor-parallel DTensor parameters)");
  for (auto& [names, t] : params)
    claimed_originals()[t.impl()] = Claim{t.impl_ptr(), "\"" + names[0] + "\" of a " + label + " unit"};

  auto st = std::make_shared<FSDPState>();
  st->module = &module;
  st->label = label;
  st->opt = options;
  st->group = std::make_unique<FSDPParamGroup>(module, std::move(params), mesh, options, label, tp_layout);
  for (const FSDPParam& p : st->group->params()) fsdp_dtensors()[p.sharded.impl()] = p.sharded.impl_ptr();
  std::weak_ptr<FSDPState> w = st;
  st->group->on_grad_ready = [w](int idx) {
    if (auto s = w.lock()) s->on_grad_ready(idx);
  };
  module.set_composable_state(FSDPState::kKey, st);  // the module owns its state (the hooks share it)
  module.register_forward_pre_hook(
      [st](nn::Module&, const std::vector<Tensor>& in) -> std::optional<std::vector<Tensor>> {
        std::vector<Tensor> x = in;
        st->pre_forward(x);
        return x;
      });
  module.register_forward_hook([st](nn::Module&, const std::vector<Tensor>&,
                                    const std::vector<Tensor>& out) -> std::optional<std::vector<Tensor>> {
    std::vector<Tensor> y = out;
    st->post_forward(y);
    return y;
  });
}

bool is_fully_sharded(const nn::Module& module) { return state_of(&module) != nullptr; }

FSDPParamGroup* fsdp_param_group(const nn::Module& module) {
  FSDPState* s = state_of(&module);
  return s ? s->group.get() : nullptr;
}

namespace {
/// Calls fn on the state of every unit under `module`. Errors (naming `what`): no unit.
void for_each_unit(nn::Module& module, const char* what, const std::function<void(FSDPState&)>& fn) {
  int n = 0;
  for (auto& [name, m] : module.named_modules()) {
    FSDPState* s = state_of(m.get());
    if (!s) continue;
    fn(*s);
    ++n;
  }
  DTR_CHECK(n > 0, what, ": no fully_shard unit under this ", module.type_name());
}
}  // namespace

void set_requires_gradient_sync(nn::Module& module, bool requires_sync) {
  for_each_unit(module, "set_requires_gradient_sync", [&](FSDPState& s) { s.requires_sync = requires_sync; });
}

void set_fsdp_hooks_enabled(nn::Module& module, bool enabled) {
  for_each_unit(module, "set_fsdp_hooks_enabled", [&](FSDPState& s) { s.hooks_enabled = enabled; });
}

}  // namespace dtr
