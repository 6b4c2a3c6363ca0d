// Activation checkpointing of modules (see activation_checkpoint.h).
#include "parallel/activation_checkpoint.h"

#include <memory>
#include <unordered_map>

#include "parallel/fsdp/fully_shard.h"
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
    std::vector<SavedTensor> saved;
    std::vector<bool> wants;
    for (const Tensor& x : inputs) {
      saved.emplace_back(x);
      wants.push_back(x.defined() && x.requires_grad());
    }
    nn::Module* mod = &m;
    const GeneratorState rng = cs.rng;
    record("checkpoint", inputs, outs,
           [mod, saved = std::move(saved), wants = std::move(wants), rng](const std::vector<Tensor>& grads,
                                                                           const std::vector<bool>& needs) {
             std::vector<Tensor> detached;
             for (size_t i = 0; i < saved.size(); ++i) {
               Tensor x = saved[i].get("checkpoint");
               if (x.defined()) {
                 x = x.detach();
                 if (wants[i]) x.set_requires_grad(true);
               }
               detached.push_back(x);
             }
             std::vector<Tensor> re;
             {
               GeneratorStateGuard rng_guard(rng);
               GradModeGuard grad_on(true);
               re = mod->forward_list(detached);
             }
             DTR_CHECK(re.size() == grads.size(), "checkpoint: recomputation of ", mod->type_name(), " returned ",
                       re.size(), " outputs, the forward returned ", grads.size());
             std::vector<Tensor> roots, root_grads;
             for (size_t i = 0; i < re.size(); ++i) {
               if (!re[i].defined() || !grads[i].defined() || !re[i].requires_grad()) continue;
               DTR_CHECK(re[i].sizes() == grads[i].sizes(), "checkpoint: recomputed output ", i, " of ",
                         mod->type_name(), " has shape ", re[i].sizes(), ", the forward produced ", grads[i].sizes());
               roots.push_back(re[i]);
               root_grads.push_back(grads[i].dtype() == re[i].dtype() ? grads[i] : grads[i].to(re[i].dtype()));
             }
             if (!roots.empty()) run_backward(roots, root_grads, /*retain_graph=*/false);
             std::vector<Tensor> result(detached.size());
             for (size_t i = 0; i < detached.size(); ++i)
               if (needs[i] && detached[i].defined()) result[i] = detached[i].grad();
             return result;
           });
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
