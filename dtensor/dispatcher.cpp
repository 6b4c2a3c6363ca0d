// The dtensor side of the op dispatcher: for a call with distributed inputs, find the op's
// sharding rule, decide (cached), redistribute inputs, run the local kernel, wrap outputs. Rules
// that do not place strided shards themselves see them as Replicate (one place for FSDP + TP
// parameters in every op).
// Installed into the tensor layer at load time, with the optimizer's local-tensor converter
// (optimizers step a DTensor parameter's local shard), so that any DTensor parameter (TP,
// FSDP, distribute_tensor) can be handed to an optimizer without further setup.
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "dtensor/comm_debug.h"
#include "dtensor/propagation.h"
#include "dtensor/redistribute.h"
#include "tensor/optim/local.h"

namespace dtr {
namespace {

PropagationStats g_stats;

/// Binary cache key: op, every input's (defined, shape, dtype, placements, mesh), every attr.
class KeyWriter {
 public:
  void raw(const void* p, size_t n) { s_.append(static_cast<const char*>(p), n); }
  template <class T> void pod(const T& v) { raw(&v, sizeof(T)); }
  void shape(const Shape& v) {
    pod(v.size());
    raw(v.data(), v.size() * sizeof(int64_t));
  }
  void attr(const Attr& a) {
    pod(static_cast<uint8_t>(a.index()));
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, Shape>) shape(v);
          else if constexpr (std::is_same_v<V, std::string>) {
            pod(v.size());
            raw(v.data(), v.size());
          } else pod(v);
        },
        a);
  }
  std::string& str() { return s_; }

 private:
  std::string s_;
};

std::string make_key(const OpCall& call, const std::vector<const DTensorSpec*>& specs) {
  KeyWriter k;
  k.str().reserve(256);
  k.pod(call.op);
  for (const DTensorSpec* s : specs) {
    k.pod(s != nullptr);
    if (!s) continue;
    k.shape(s->shape);
    k.pod(s->dtype);
    for (const auto& p : s->placements) {
      k.pod(p.kind);
      k.pod(p.dim);
      k.pod(p.reduce);
      k.pod(p.split_factor);
    }
    const auto& r = s->mesh.ranks();
    k.pod(r.size());
    k.raw(r.data(), r.size() * sizeof(int));
    k.shape(s->mesh.shape());
  }
  for (const Attr& a : call.attrs) k.attr(a);
  return std::move(k.str());
}

class DTensorDispatcher final : public DistributedDispatcher {
 public:
  std::vector<Tensor> dispatch(const OpCall& call) override {
    // 1. Specs of the inputs; plain tensors count as replicated on the common mesh.
    const DTensorSpec* first = nullptr;
    for (const Tensor& t : call.inputs)
      if (t.defined() && t.is_distributed()) {
        const DTensorSpec& s = dtensor_spec(t);
        if (!first) first = &s;
        DTR_CHECK(s.mesh == first->mesh, call.name(), ": operands on different meshes (", first->mesh.str(), " and ",
                  s.mesh.str(), ")");
      }
    const DeviceMesh& mesh = first->mesh;
    std::vector<std::optional<DTensorSpec>> implicit(call.inputs.size());
    std::vector<const DTensorSpec*> specs(call.inputs.size(), nullptr);
    for (size_t i = 0; i < call.inputs.size(); ++i) {
      const Tensor& t = call.inputs[i];
      if (!t.defined()) continue;
      if (t.is_distributed()) {
        specs[i] = &dtensor_spec(t);
      } else {
        implicit[i].emplace(DTensorSpec{mesh, replicate_all(mesh.ndim()), t.sizes(), t.dtype()});
        specs[i] = &*implicit[i];
      }
    }
    // Strided shards (FSDP + TP parameters): a rule that does not place them itself sees them as
    // Replicate; step 3 redistributes those inputs from their real placements.
    bool any_strided = false;
    for (const DTensorSpec* sp : specs)
      if (sp)
        for (const auto& p : sp->placements) any_strided = any_strided || p.is_strided_shard();
    const RuleEntry* rule = nullptr;
    std::vector<std::optional<DTensorSpec>> plain(any_strided ? call.inputs.size() : 0);
    std::vector<const DTensorSpec*> rule_specs = specs;
    if (any_strided) {
      rule = find_sharding_rule(call.op->name);
      if (rule && rule->strided == StridedInputs::Replicate)
        for (size_t i = 0; i < specs.size(); ++i)
          if (specs[i]) rule_specs[i] = &plain[i].emplace(without_strided(*specs[i]));
    }
    OpSchema schema{call, rule_specs, mesh};
    // 2. Decision (cached by op and every argument).
    const ShardingDecision* d = nullptr;
    std::string key = make_key(call, specs);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) {
        d = &it->second;
        ++g_stats.hits;
      }
    }
    if (!d) {
      if (!rule) rule = find_sharding_rule(call.op->name);
      DTR_CHECK(rule != nullptr, call.name(), ": no sharding rule for distributed inputs ",
                describe(OpSchema{call, specs, mesh}));
      ShardingDecision dec = rule->rule(schema);
      std::lock_guard<std::mutex> lock(mu_);
      ++g_stats.misses;
      d = &cache_.emplace(std::move(key), std::move(dec)).first->second;
    }
    // 3. Redistribute inputs, run locally, wrap.
    std::vector<Tensor> locals(call.inputs.size());
    for (size_t i = 0; i < call.inputs.size(); ++i) {
      const Tensor& t = call.inputs[i];
      if (!t.defined()) continue;
      const Tensor& local = t.is_distributed() ? local_tensor(t) : t;
      const Placements& want = d->input_placements.at(i);
      if (want == specs[i]->placements) {
        locals[i] = local;
      } else {
        if (dtensor_debug_enabled())
          std::cerr << "[dtensor] " << call.name() << ": input " << i << " " << placements_str(specs[i]->placements)
                    << " -> " << placements_str(want) << "\n";
        locals[i] = redistribute_local(local, *specs[i], want);
      }
    }
    std::vector<Tensor> outs;
    if (d->local_fn) {
      outs = d->local_fn(locals, schema);
    } else {
      OpCall local{call.op, std::move(locals), d->rewrite_attrs ? d->local_attrs : call.attrs};
      outs = run_kernel(local);
    }
    if (d->inplace) return {call.inputs[0]};
    DTR_CHECK(outs.size() == d->output_placements.size(), call.name(), ": rule gave ", d->output_placements.size(),
              " output placements for ", outs.size(), " outputs");
    std::vector<Tensor> wrapped(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i].defined()) continue;
      DTensorSpec s{mesh, d->output_placements[i], d->output_shapes.at(i), outs[i].dtype()};
      wrapped[i] = make_dtensor(outs[i], s, /*check=*/false);
    }
    return wrapped;
  }

  /// The gradient of a leaf lands in the leaf's placements, Partial mapped to Replicate (the
  /// gradient of a pending sum is the same on every rank); a leaf marked grad_keeps_partial keeps
  /// a Partial gradient where it is Replicate. A plain leaf (used as a replicated value) gets the
  /// full gradient as a plain tensor.
  Tensor grad_for_leaf(const Tensor& leaf, const Tensor& grad) override {
    if (!leaf.is_distributed()) {
      const DTensorSpec& gs = dtensor_spec(grad, "AccumulateGrad");
      return redistribute_local(local_tensor(grad), gs, replicate_all(gs.mesh.ndim()));
    }
    const DTensorSpec& ls = dtensor_spec(leaf, "AccumulateGrad");
    Placements want = without_partial(ls.placements);
    if (grad.is_distributed() && static_cast<const DTensorState*>(leaf.dist_spec().get())->grad_keeps_partial) {
      const Placements& gp = dtensor_spec(grad).placements;
      for (size_t i = 0; i < want.size(); ++i)
        if (ls.placements[i].is_replicate() && gp[i].is_partial()) want[i] = gp[i];
    }
    if (!grad.is_distributed()) {
      // A plain gradient for a distributed leaf: treat it as the replicated full value.
      DTensorSpec rs{ls.mesh, replicate_all(ls.mesh.ndim()), grad.sizes(), grad.dtype()};
      return make_dtensor(redistribute_local(grad, rs, want), DTensorSpec{ls.mesh, want, ls.shape, grad.dtype()});
    }
    if (dtensor_spec(grad).placements == want) return grad;
    return redistribute(grad, want);
  }

  static std::string describe(const OpSchema& s) {
    std::string out;
    for (size_t i = 0; i < s.specs.size(); ++i) {
      if (!s.specs[i]) continue;
      std::ostringstream os;
      os << s.specs[i]->shape;
      out += (out.empty() ? "" : ", ") + os.str() + " " + placements_str(s.specs[i]->placements);
    }
    return out;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.clear();
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, ShardingDecision> cache_;
};

DTensorDispatcher& instance() {
  static DTensorDispatcher d;
  return d;
}

[[maybe_unused]] const bool installed = [] {
  set_distributed_dispatcher(&instance());
  optim::set_optim_local_converter([](const Tensor& t) { return local_tensor(t); });
  return true;
}();

}  // namespace

PropagationStats propagation_stats() { return g_stats; }
void clear_propagation_cache() { instance().clear(); }

}  // namespace dtr
