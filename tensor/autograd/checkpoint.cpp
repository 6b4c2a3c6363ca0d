// Activation checkpointing (see checkpoint.h).
#include "tensor/autograd/checkpoint.h"

#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/random.h"

namespace dtr {
namespace {
thread_local int t_recompute_depth = 0;
struct RecomputeScope {
  RecomputeScope() { ++t_recompute_depth; }
  ~RecomputeScope() { --t_recompute_depth; }
};
}  // namespace

bool checkpoint_recomputing() { return t_recompute_depth > 0; }

void record_checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs, std::vector<Tensor>& outs,
                       GeneratorState rng, const std::string& what) {
  std::vector<SavedTensor> saved;
  std::vector<bool> wants;
  saved.reserve(inputs.size());
  for (const Tensor& x : inputs) {
    saved.emplace_back(x);
    wants.push_back(x.defined() && x.requires_grad());
  }
  const std::string label = what.empty() ? "checkpoint" : "checkpoint of " + what;
  record("checkpoint", inputs, outs,
         [fn, label, saved = std::move(saved), wants = std::move(wants), rng](const std::vector<Tensor>& grads,
                                                                               const std::vector<bool>& needs) {
           std::vector<Tensor> detached;
           detached.reserve(saved.size());
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
             RecomputeScope recompute;
             re = fn(detached);
           }
           DTR_CHECK(re.size() == grads.size(), label, ": recomputation returned ", re.size(),
                     " outputs, the forward returned ", grads.size(), " (the function must be deterministic)");
           std::vector<Tensor> roots, root_grads;
           for (size_t i = 0; i < re.size(); ++i) {
             if (!re[i].defined() || !grads[i].defined() || !re[i].requires_grad()) continue;
             DTR_CHECK(re[i].sizes() == grads[i].sizes(), label, ": recomputed output ", i, " has shape ",
                       re[i].sizes(), ", the forward produced ", grads[i].sizes());
             roots.push_back(re[i]);
             root_grads.push_back(grads[i].dtype() == re[i].dtype() ? grads[i] : grads[i].to(re[i].dtype()));
           }
           if (!roots.empty()) run_backward(roots, root_grads, /*retain_graph=*/false);
           std::vector<Tensor> result(detached.size());
           for (size_t i = 0; i < detached.size(); ++i)
             if (needs[i] && detached[i].defined()) result[i] = detached[i].grad();
           return result;
         });
}

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  DTR_CHECK(fn != nullptr, "checkpoint: empty function");
  if (!grad_enabled()) return fn(inputs);
  const GeneratorState rng = generator_state();
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    outs = fn(inputs);
  }
  // Fresh handles: an output that is an input (or a view sharing its impl) must not get
  // this node as its grad_fn.
  bool any_floating = false;
  for (Tensor& o : outs) {
    if (!o.defined()) continue;
    o = o.detach();
    any_floating = any_floating || is_floating(o.dtype());
  }
  if (!any_floating) return outs;

  record_checkpoint(fn, inputs, outs, rng, "");
  return outs;
}

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs) {
  DTR_CHECK(fn != nullptr, "checkpoint: empty function");
  auto outs = checkpoint(CheckpointFn([fn](const std::vector<Tensor>& xs) { return std::vector<Tensor>{fn(xs)}; }),
                         inputs);
  return outs[0];
}

}  // namespace dtr
