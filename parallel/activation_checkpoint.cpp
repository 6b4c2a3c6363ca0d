// Activation checkpointing of modules (see activation_checkpoint.h).
#include "parallel/activation_checkpoint.h"

#include <memory>
#include <unordered_map>

#include "parallel/fsdp/fully_shard.h"
#include "tensor/autograd/checkpoint.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/random.h"

namespace dtr {
namespace {

/// Checkpointed modules -> a token owned by their hooks (expired once the module is gone, so
/// a new module at a recycled address is not mistaken for a checkpointed one).
std::unordered_map<const nn::Module*, std::weak_ptr<int>>& checkpointed() {
  static std::unordered_map<const nn::Module*, std::weak_ptr<int>> s;
  return s;
}

/// Per-call state between the pre-hook and the hook (a stack: a module may be re-entered).
struct CallState {
  bool prev_grad = false;
  GeneratorState rng;
};


}  // namespace

bool is_checkpointed(const nn::Module& module) {
  auto it = checkpointed().find(&module);
  if (it == checkpointed().end()) return false;
  if (it->second.expired()) {
    checkpointed().erase(it);
    return false;
  }
  return true;
}

void checkpoint_module(nn::Module& module) {
  DTR_CHECK(!is_checkpointed(module), "checkpoint_module: ", module.type_name(), " is already checkpointed");
  DTR_CHECK(!is_fully_sharded(module), "checkpoint_module: fully_shard was already applied to this ",
            module.type_name(), "; apply activation checkpointing first");
  auto token = std::make_shared<int>(0);
  checkpointed()[&module] = token;
  auto calls = std::make_shared<std::vector<CallState>>();
  module.register_forward_pre_hook(
      [calls, token](nn::Module&, const std::vector<Tensor>&) -> std::optional<std::vector<Tensor>> {
        calls->push_back({grad_enabled(), generator_state()});
        set_grad_enabled(false);
        return std::nullopt;
      });
  module.register_forward_hook([calls](nn::Module& m, const std::vector<Tensor>& inputs,
                                       const std::vector<Tensor>& outputs) -> std::optional<std::vector<Tensor>> {
    DTR_CHECK(!calls->empty(), "checkpoint_module: forward hook without its pre-hook");
    const CallState cs = calls->back();
    calls->pop_back();
    set_grad_enabled(cs.prev_grad);
    if (!cs.prev_grad) return std::nullopt;
    std::vector<Tensor> outs;
    bool any_floating = false;
    for (const Tensor& o : outputs) {
      outs.push_back(o.defined() ? o.detach() : o);
      any_floating = any_floating || (o.defined() && is_floating(o.dtype()));
    }
    if (!any_floating) return outs;
    nn::Module* mod = &m;
    record_checkpoint([mod](const std::vector<Tensor>& xs) { return mod->forward_list(xs); }, inputs, outs, cs.rng,
                      m.type_name());
    return outs;
  });
}

int apply_activation_checkpointing(nn::Module& root,
                                   const std::function<bool(const std::string&, nn::Module&)>& pred) {
  int n = 0;
  for (auto& [fqn, m] : root.named_modules())
    if (pred(fqn, *m)) {
      checkpoint_module(*m);
      ++n;
    }
  return n;
}

}  // namespace dtr
