#pragma once
// nn::Module: a tree of named parameters, buffers and submodules with Hugging Face style
// dotted names ("model.layers.0.self_attn.q_proj.weight"), train/eval mode, forward hooks,
// state_dict / load_state_dict, and in-place replacement of submodules and parameters (LoRA
// injection, tensor-parallel class swaps, FSDP's distributed parameters).
// Source: torch.nn.Module semantics.
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace dtr::nn {

class Module;

/// Per-module state of a composable distributed API (fully_shard, replicate,
/// checkpoint_module), stored on the module under the API's key, so no global registry keyed by
/// module pointer is needed and the state lives exactly as long as the module. A state type
/// names its key as `static constexpr const char* kKey`. Source: PyTorch's composable state
/// (torch.distributed._composable_state, _composable.contract's per-module registry).
struct ModuleState {
  virtual ~ModuleState() = default;
};

/// FQN -> tensor. Values returned by state_dict() are detached handles sharing the data.
using StateDict = std::map<std::string, Tensor>;

/// Runs before forward with the module and its inputs; returns replacement inputs or nullopt.
/// Source: torch.nn.Module.register_forward_pre_hook.
using ForwardPreHook = std::function<std::optional<std::vector<Tensor>>(Module&, const std::vector<Tensor>&)>;
/// Runs after forward with the module, its inputs and its outputs; returns replacement outputs
/// or nullopt. Source: torch.nn.Module.register_forward_hook.
using ForwardHook = std::function<std::optional<std::vector<Tensor>>(Module&, const std::vector<Tensor>&,
                                                                     const std::vector<Tensor>&)>;

/// What load_state_dict found (only returned when strict = false; strict mode throws instead).
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

/// Base of all layers. Owned through std::shared_ptr (make_shared); not copyable.
///
/// Forward convention: modules with one tensor in and one out override forward(const Tensor&);
/// others override forward_list(const std::vector<Tensor>&). call()/call_list() run the
/// forward pre/post hooks around forward_list(), whose default forwards to forward(Tensor).
class Module : public std::enable_shared_from_this<Module> {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The class name used in messages and by parallel plans, e.g. "Linear".
  virtual std::string type_name() const { return "Module"; }

  // ---- forward -----------------------------------------------------------------------------
  /// Single-tensor forward. Default: throws (the module has no single-tensor forward).
  virtual Tensor forward(const Tensor& x);
  /// General forward. Default: requires exactly one input and calls forward(Tensor).
  virtual std::vector<Tensor> forward_list(const std::vector<Tensor>& inputs);
  /// Runs pre hooks, forward_list, post hooks (like calling a torch module).
  std::vector<Tensor> call_list(const std::vector<Tensor>& inputs);
  /// call_list({x}) for a module with exactly one output. Errors: forward returned != 1 tensor.
  Tensor call(const Tensor& x);
  Tensor operator()(const Tensor& x) { return call(x); }

  /// Hooks run in registration order; the returned handle removes them.
  size_t register_forward_pre_hook(ForwardPreHook h);
  size_t register_forward_hook(ForwardHook h);
  /// Removes a hook by handle (either kind); false when no such hook.
  bool remove_hook(size_t handle);
  /// True when any forward pre / post hook is registered.
  bool has_forward_hooks() const { return !pre_hooks_.empty() || !post_hooks_.empty(); }

  // ---- registration ------------------------------------------------------------------------
  /// Registers (or replaces) a parameter; sets requires_grad on it (a leaf) when asked.
  /// Returns the tensor. Errors: empty name or a name with '.'; name taken by a buffer/module.
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  /// Registers a buffer (state that is not a parameter). Non-persistent buffers are left out
  /// of state_dict (e.g. RoPE tables).
  Tensor register_buffer(const std::string& name, Tensor t, bool persistent = true);
  /// Registers (or replaces) a child module. Returns it.
  std::shared_ptr<Module> register_module(const std::string& name, std::shared_ptr<Module> m);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    register_module(name, std::static_pointer_cast<Module>(m));
    return m;
  }

  // ---- access ------------------------------------------------------------------------------
  bool has_parameter(const std::string& name) const;
  bool has_buffer(const std::string& name) const;
  bool has_module(const std::string& name) const;
  /// This module's own parameter / buffer `name` (no dots). Errors: unknown name (lists the
  /// names that exist).
  Tensor parameter(const std::string& name) const;
  Tensor buffer(const std::string& name) const;
  /// The descendant at dotted path `path` ("" = this module). Errors: a missing component.
  std::shared_ptr<Module> get_submodule(const std::string& path);
  /// The parameter at dotted FQN `fqn` ("layers.0.q_proj.weight").
  Tensor get_parameter(const std::string& fqn);

  /// Replaces the existing submodule at dotted `path` (LoRA injection, TP class swaps).
  /// Errors: the path or its last component does not exist.
  void set_submodule(const std::string& path, std::shared_ptr<Module> m);
  /// Replaces the existing parameter at dotted `fqn` by `t` in the registry (FSDP / TP swap in
  /// distributed tensors). requires_grad is taken from `t` as given.
  /// Errors: no such parameter.
  void set_parameter(const std::string& fqn, Tensor t);
  /// Replaces the existing buffer at dotted `fqn` (keeps its persistence).
  void set_buffer(const std::string& fqn, Tensor t);

  // ---- traversal (registration order, pre-order, FQNs with `prefix`) -----------------------
  /// Each tensor once (tied weights keep their first name) when remove_duplicate.
  std::vector<std::pair<std::string, Tensor>> named_parameters(const std::string& prefix = "", bool recurse = true,
                                                               bool remove_duplicate = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(const std::string& prefix = "", bool recurse = true) const;
  /// Pre-order, this module first with name `prefix` ("" by default); each module once.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules(const std::string& prefix = "");
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  std::vector<std::shared_ptr<Module>> children() const;
  /// Calls fn on every descendant (children first, post-order) and then on this module.
  Module& apply(const std::function<void(Module&)>& fn);

  // ---- mode --------------------------------------------------------------------------------
  /// Sets training mode on this module and all descendants (virtual: a layer may extend it).
  virtual Module& train(bool mode = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }

  // ---- state -------------------------------------------------------------------------------
  /// Parameters and persistent buffers by FQN (tied weights appear under every name), detached.
  StateDict state_dict(const std::string& prefix = "") const;
  /// Copies values (any dtype, converted) into this module's tensors under NoGradGuard.
  /// Errors (checked before anything is copied): a shape mismatch (always) names the key and
  /// both shapes; with strict, missing and unexpected keys are listed by name.
  LoadResult load_state_dict(const StateDict& sd, bool strict = true);

  // ---- composable API state (see ModuleState) -----------------------------------------------
  /// The state stored under `key`; null when none.
  std::shared_ptr<ModuleState> composable_state(const std::string& key) const;
  /// Stores `state` (non-null) under `key`. Errors: a state is already stored under `key` (the
  /// API was applied twice; the message names the key and the module type).
  void set_composable_state(const std::string& key, std::shared_ptr<ModuleState> state);
  /// Keys with a stored state, sorted (messages: which APIs manage this module).
  std::vector<std::string> composable_state_keys() const;
  /// The state of type T (stored under T::kKey); null when none.
  template <class T>
  T* state() const {
    auto s = composable_state(T::kKey);
    return dynamic_cast<T*>(s.get());
  }
  template <class T>
  std::shared_ptr<T> state_ptr() const {
    return std::dynamic_pointer_cast<T>(composable_state(T::kKey));
  }

 protected:
  struct NamedTensor {
    std::string name;
    Tensor tensor;
    bool persistent = true;
  };
  struct NamedModule {
    std::string name;
    std::shared_ptr<Module> module;
  };

 private:
  void check_new_name(const std::string& name, const char* what) const;
  /// Owner module of the last component of `path` and that component.
  std::pair<Module*, std::string> resolve(const std::string& path, const char* op);
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, std::shared_ptr<Module>>>& out,
                       std::vector<const Module*>& seen);

  std::vector<NamedTensor> params_;
  std::vector<NamedTensor> buffers_;
  std::vector<NamedModule> modules_;
  std::vector<std::pair<size_t, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<size_t, ForwardHook>> post_hooks_;
  size_t next_hook_ = 1;
  bool training_ = true;
  std::map<std::string, std::shared_ptr<ModuleState>> composable_states_;
};

}  // namespace dtr::nn
