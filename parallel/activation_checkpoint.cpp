// Activation checkpointing of modules (see activation_checkpoint.h).
#include "parallel/activation_checkpoint.h"

#include <memory>

#include "parallel/fsdp/fully_shard.h"
#include "tensor/autograd/checkpoint.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/dispatch_mode.h"
#include "tensor/random.h"

namespace dtr {
namespace {

/// checkpoint_module's state, stored on the module (nn::Module::state<CheckpointState>()).
struct CheckpointState : nn::ModuleState {
  static constexpr const char* kKey = "checkpoint";
  CheckpointPolicy policy = CheckpointPolicy::full;
};

bool on_save_list(const OpCall& call) {
  const std::string& n = call.op->name;
  return n == "mm" || n == "bmm" || n == "sdpa";
}

/// Outputs of the save-list ops of one forward call, in call order.
struct SelectiveCache {
  std::vector<std::pair<const OpDef*, std::vector<SavedTensor>>> saved;
  size_t next = 0;
};

/// Forward: runs every op, keeps the outputs of save-list ops.
struct RecordMode final : DispatchMode {
  std::shared_ptr<SelectiveCache> cache;
  std::vector<Tensor> dispatch(const OpCall& call) override {
    std::vector<Tensor> outs = dtr::dispatch(call);
    if (on_save_list(call)) {
      std::vector<SavedTensor> keep;
      for (const Tensor& o : outs) keep.emplace_back(o);
      cache->saved.push_back({call.op, std::move(keep)});
    }
    return outs;
  }
};

/// Recomputation: save-list ops return the forward's outputs (fresh handles), others run.
struct ReplayMode final : DispatchMode {
  std::shared_ptr<SelectiveCache> cache;
  std::string what;
  std::vector<Tensor> dispatch(const OpCall& call) override {
    if (!on_save_list(call)) return dtr::dispatch(call);
    DTR_CHECK(cache->next < cache->saved.size() && cache->saved[cache->next].first == call.op,
              "selective activation checkpointing of ", what, ": the recomputation called ", call.name(),
              " as save-list op #", cache->next, " but the forward ",
              cache->next < cache->saved.size() ? "called " + cache->saved[cache->next].first->name
                                               : std::string("had no more"),
              " (the forward must be deterministic)");
    std::vector<Tensor> outs;
    for (const SavedTensor& t : cache->saved[cache->next].second) {
      Tensor o = t.get("selective activation checkpointing");
      outs.push_back(o.defined() ? o.detach() : o);
    }
    ++cache->next;
    return outs;
  }
};

/// Per-call state between the pre-hook and the hook (a stack: a module may be re-entered).
struct CallState {
  bool prev_grad = false;
  GeneratorState rng;
  std::shared_ptr<RecordMode> record;  // selective policy with grad on
  DispatchMode* prev_mode = nullptr;
};


}  // namespace

bool is_checkpointed(const nn::Module& module) { return module.state<CheckpointState>() != nullptr; }

CheckpointPolicy checkpoint_policy_from_name(const std::string& name) {
  if (name == "full") return CheckpointPolicy::full;
  if (name == "selective") return CheckpointPolicy::selective;
  DTR_ERROR("activation checkpointing: unknown policy '", name, "' (expected full or selective)");
}

const char* checkpoint_policy_name(CheckpointPolicy policy) {
  return policy == CheckpointPolicy::selective ? "selective" : "full";
}

const std::vector<std::string>& selective_ac_save_list() {
  static const std::vector<std::string> l{"mm", "bmm", "sdpa"};
  return l;
}

void checkpoint_module(nn::Module& module, CheckpointPolicy policy) {
  DTR_CHECK(!is_checkpointed(module), "checkpoint_module: ", module.type_name(), " is already checkpointed");
  DTR_CHECK(!is_fully_sharded(module), "checkpoint_module: fully_shard was already applied to this ",
            module.type_name(), "; apply activation checkpointing first");
  auto st = std::make_shared<CheckpointState>();
  st->policy = policy;
  module.set_composable_state(CheckpointState::kKey, st);
  auto calls = std::make_shared<std::vector<CallState>>();
  module.register_forward_pre_hook(
      [calls, policy](nn::Module&, const std::vector<Tensor>&) -> std::optional<std::vector<Tensor>> {
        CallState cs{grad_enabled(), generator_state(), nullptr, nullptr};
        if (policy == CheckpointPolicy::selective && cs.prev_grad) {
          cs.record = std::make_shared<RecordMode>();
          cs.record->cache = std::make_shared<SelectiveCache>();
          cs.prev_mode = set_dispatch_mode(cs.record.get());
        }
        calls->push_back(std::move(cs));
        set_grad_enabled(false);
        return std::nullopt;
      });
  module.register_forward_hook([calls](nn::Module& m, const std::vector<Tensor>& inputs,
                                       const std::vector<Tensor>& outputs) -> std::optional<std::vector<Tensor>> {
    DTR_CHECK(!calls->empty(), "checkpoint_module: forward hook without its pre-hook");
    const CallState cs = calls->back();
    calls->pop_back();
    set_grad_enabled(cs.prev_grad);
    if (cs.record) set_dispatch_mode(cs.prev_mode);
    if (!cs.prev_grad) return std::nullopt;
    std::vector<Tensor> outs;
    bool any_floating = false;
    for (const Tensor& o : outputs) {
      outs.push_back(o.defined() ? o.detach() : o);
      any_floating = any_floating || (o.defined() && is_floating(o.dtype()));
    }
    if (!any_floating) return outs;
    nn::Module* mod = &m;
    if (!cs.record) {
      record_checkpoint([mod](const std::vector<Tensor>& xs) { return mod->forward_list(xs); }, inputs, outs, cs.rng,
                        m.type_name());
      return outs;
    }
    auto cache = cs.record->cache;
    const std::string what = m.type_name();
    record_checkpoint(
        [mod, cache, what](const std::vector<Tensor>& xs) {
          ReplayMode replay;
          replay.cache = cache;
          replay.what = what;
          std::vector<Tensor> re;
          {
            DispatchModeGuard guard(&replay);
            re = mod->forward_list(xs);
          }
          DTR_CHECK(cache->next == cache->saved.size(), "selective activation checkpointing of ", what,
                    ": the recomputation used ", cache->next, " of the ", cache->saved.size(),
                    " saved op outputs (the forward must be deterministic)");
          cache->saved.clear();  // the recomputed graph holds what backward needs
          cache->next = 0;
          return re;
        },
        inputs, outs, cs.rng, m.type_name());
    return outs;
  });
}

int apply_activation_checkpointing(nn::Module& root,
                                   const std::function<bool(const std::string&, nn::Module&)>& pred,
                                   CheckpointPolicy policy) {
  int n = 0;
  for (auto& [fqn, m] : root.named_modules())
    if (pred(fqn, *m)) {
      checkpoint_module(*m, policy);
      ++n;
    }
  return n;
}

}  // namespace dtr
