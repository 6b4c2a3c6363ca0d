// nn::Module (see module.h).
#include "tensor/nn/module.h"

#include <algorithm>
#include <sstream>

#include "tensor/autograd/grad_mode.h"

namespace dtr::nn {
namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

template <class V>
std::string names_of(const V& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i].name;
  os << "]";
  return os.str();
}

std::string join_list(const std::vector<std::string>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << '"' << v[i] << '"';
  return os.str();
}

template <class V>
auto find_named(V& v, const std::string& name) {
  return std::find_if(v.begin(), v.end(), [&](const auto& e) { return e.name == name; });
}

}  // namespace

// ---- forward ---------------------------------------------------------------------------------

Tensor Module::forward(const Tensor&) {
  DTR_ERROR(type_name(), ": forward(Tensor) is not implemented for this module (use call_list)");
  return {};
}

std::vector<Tensor> Module::forward_list(const std::vector<Tensor>& inputs) {
  DTR_CHECK(inputs.size() == 1, type_name(), ": forward takes 1 tensor, got ", inputs.size());
  return {forward(inputs[0])};
}

std::vector<Tensor> Module::call_list(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> in = inputs;
  // Copy the hook lists: a hook may remove itself while running.
  const auto pre = pre_hooks_;
  for (const auto& [id, h] : pre) {
    if (auto r = h(*this, in)) in = std::move(*r);
  }
  std::vector<Tensor> out = forward_list(in);
  const auto post = post_hooks_;
  for (const auto& [id, h] : post) {
    if (auto r = h(*this, in, out)) out = std::move(*r);
  }
  return out;
}

Tensor Module::call(const Tensor& x) {
  std::vector<Tensor> out = call_list({x});
  DTR_CHECK(out.size() == 1, type_name(), ": call(Tensor) expects one output, forward returned ", out.size());
  return out[0];
}

size_t Module::register_forward_pre_hook(ForwardPreHook h) {
  DTR_CHECK(h != nullptr, type_name(), ": register_forward_pre_hook: empty hook");
  pre_hooks_.emplace_back(next_hook_, std::move(h));
  return next_hook_++;
}

size_t Module::register_forward_hook(ForwardHook h) {
  DTR_CHECK(h != nullptr, type_name(), ": register_forward_hook: empty hook");
  post_hooks_.emplace_back(next_hook_, std::move(h));
  return next_hook_++;
}

bool Module::remove_hook(size_t handle) {
  auto match = [handle](const auto& e) { return e.first == handle; };
  const size_t before = pre_hooks_.size() + post_hooks_.size();
  pre_hooks_.erase(std::remove_if(pre_hooks_.begin(), pre_hooks_.end(), match), pre_hooks_.end());
  post_hooks_.erase(std::remove_if(post_hooks_.begin(), post_hooks_.end(), match), post_hooks_.end());
  return pre_hooks_.size() + post_hooks_.size() != before;
}

// ---- registration ----------------------------------------------------------------------------

void Module::check_new_name(const std::string& name, const char* what) const {
  DTR_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(), ": ", what, " name \"", name,
            "\" must be non-empty and contain no '.'");
  const bool is_param = has_parameter(name), is_buffer = has_buffer(name), is_module = has_module(name);
  const std::string kind = what;
  DTR_CHECK(!(is_param && kind != "parameter") && !(is_buffer && kind != "buffer") &&
                !(is_module && kind != "module"),
            type_name(), ": cannot register ", what, " \"", name, "\": the name is already a ",
            is_param ? "parameter" : is_buffer ? "buffer" : "module");
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "parameter");
  DTR_CHECK(t.defined(), type_name(), ": register_parameter(\"", name, "\"): undefined tensor");
  if (t.is_leaf() && t.requires_grad() != requires_grad && (is_floating(t.dtype()) || !requires_grad))
    t.set_requires_grad(requires_grad);
  auto it = find_named(params_, name);
  if (it != params_.end()) it->tensor = t;
  else params_.push_back({name, t, true});
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t, bool persistent) {
  check_new_name(name, "buffer");
  DTR_CHECK(t.defined(), type_name(), ": register_buffer(\"", name, "\"): undefined tensor");
  auto it = find_named(buffers_, name);
  if (it != buffers_.end()) *it = {name, t, persistent};
  else buffers_.push_back({name, t, persistent});
  return t;
}

std::shared_ptr<Module> Module::register_module(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name, "module");
  DTR_CHECK(m != nullptr, type_name(), ": register_module(\"", name, "\"): null module");
  DTR_CHECK(m.get() != this, type_name(), ": register_module(\"", name, "\"): a module cannot contain itself");
  auto it = find_named(modules_, name);
  if (it != modules_.end()) it->module = m;
  else modules_.push_back({name, m});
  return m;
}

// ---- access ----------------------------------------------------------------------------------

bool Module::has_parameter(const std::string& name) const {
  return std::any_of(params_.begin(), params_.end(), [&](const auto& e) { return e.name == name; });
}
bool Module::has_buffer(const std::string& name) const {
  return std::any_of(buffers_.begin(), buffers_.end(), [&](const auto& e) { return e.name == name; });
}
bool Module::has_module(const std::string& name) const {
  return std::any_of(modules_.begin(), modules_.end(), [&](const auto& e) { return e.name == name; });
}

Tensor Module::parameter(const std::string& name) const {
  for (const auto& e : params_)
    if (e.name == name) return e.tensor;
  DTR_CHECK(false, type_name(), ": no parameter \"", name, "\" (parameters: ", names_of(params_), ")");
  return {};
}

Tensor Module::buffer(const std::string& name) const {
  for (const auto& e : buffers_)
    if (e.name == name) return e.tensor;
  DTR_CHECK(false, type_name(), ": no buffer \"", name, "\" (buffers: ", names_of(buffers_), ")");
  return {};
}

std::shared_ptr<Module> Module::get_submodule(const std::string& path) {
  std::shared_ptr<Module> cur = weak_from_this().lock();
  if (!cur) cur = std::shared_ptr<Module>(this, [](Module*) {});  // not owned by a shared_ptr
  if (path.empty()) return cur;
  std::string walked;
  for (const std::string& part : split_path(path)) {
    auto it = find_named(cur->modules_, part);
    DTR_CHECK(it != cur->modules_.end(), "get_submodule(\"", path, "\"): ", cur->type_name(),
              walked.empty() ? std::string() : " at \"" + walked + "\"", " has no submodule \"", part,
              "\" (children: ", names_of(cur->modules_), ")");
    cur = it->module;
    walked = join_name(walked, part);
  }
  return cur;
}

std::pair<Module*, std::string> Module::resolve(const std::string& path, const char* op) {
  DTR_CHECK(!path.empty(), type_name(), ": ", op, ": empty name");
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos) return {this, path};
  return {get_submodule(path.substr(0, dot)).get(), path.substr(dot + 1)};
}

Tensor Module::get_parameter(const std::string& fqn) {
  auto [owner, name] = resolve(fqn, "get_parameter");
  return owner->parameter(name);
}

void Module::set_submodule(const std::string& path, std::shared_ptr<Module> m) {
  auto [owner, name] = resolve(path, "set_submodule");
  DTR_CHECK(owner->has_module(name), "set_submodule(\"", path, "\"): ", owner->type_name(), " has no submodule \"",
            name, "\" (children: ", names_of(owner->modules_), ")");
  owner->register_module(name, std::move(m));
}

void Module::set_parameter(const std::string& fqn, Tensor t) {
  auto [owner, name] = resolve(fqn, "set_parameter");
  DTR_CHECK(t.defined(), "set_parameter(\"", fqn, "\"): undefined tensor");
  auto it = find_named(owner->params_, name);
  DTR_CHECK(it != owner->params_.end(), "set_parameter(\"", fqn, "\"): ", owner->type_name(), " has no parameter \"",
            name, "\" (parameters: ", names_of(owner->params_), ")");
  it->tensor = std::move(t);
}

void Module::set_buffer(const std::string& fqn, Tensor t) {
  auto [owner, name] = resolve(fqn, "set_buffer");
  DTR_CHECK(t.defined(), "set_buffer(\"", fqn, "\"): undefined tensor");
  auto it = find_named(owner->buffers_, name);
  DTR_CHECK(it != owner->buffers_.end(), "set_buffer(\"", fqn, "\"): ", owner->type_name(), " has no buffer \"",
            name, "\" (buffers: ", names_of(owner->buffers_), ")");
  it->tensor = std::move(t);
}

// ---- traversal -------------------------------------------------------------------------------

void Module::collect_modules(const std::string& prefix, std::vector<std::pair<std::string, std::shared_ptr<Module>>>& out,
                             std::vector<const Module*>& seen) {
  if (std::find(seen.begin(), seen.end(), this) != seen.end()) return;
  seen.push_back(this);
  std::shared_ptr<Module> self = weak_from_this().lock();
  if (!self) self = std::shared_ptr<Module>(this, [](Module*) {});
  out.emplace_back(prefix, self);
  for (const auto& c : modules_) c.module->collect_modules(join_name(prefix, c.name), out, seen);
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  std::vector<const Module*> seen;
  collect_modules(prefix, out, seen);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(const std::string& prefix, bool recurse,
                                                                     bool remove_duplicate) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  std::vector<const Module*> seen_modules;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m, const std::string& pre) {
    if (std::find(seen_modules.begin(), seen_modules.end(), &m) != seen_modules.end()) return;
    seen_modules.push_back(&m);
    for (const auto& p : m.params_) {
      if (remove_duplicate) {
        if (std::find(seen.begin(), seen.end(), p.tensor.impl()) != seen.end()) continue;
        seen.push_back(p.tensor.impl());
      }
      out.emplace_back(join_name(pre, p.name), p.tensor);
    }
    if (!recurse) return;
    for (const auto& c : m.modules_) walk(*c.module, join_name(pre, c.name));
  };
  walk(*this, prefix);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters("", recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(const std::string& prefix, bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  std::vector<const Module*> seen_modules;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m, const std::string& pre) {
    if (std::find(seen_modules.begin(), seen_modules.end(), &m) != seen_modules.end()) return;
    seen_modules.push_back(&m);
    for (const auto& b : m.buffers_) {
      if (std::find(seen.begin(), seen.end(), b.tensor.impl()) != seen.end()) continue;
      seen.push_back(b.tensor.impl());
      out.emplace_back(join_name(pre, b.name), b.tensor);
    }
    if (!recurse) return;
    for (const auto& c : m.modules_) walk(*c.module, join_name(pre, c.name));
  };
  walk(*this, prefix);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& c : modules_) out.emplace_back(c.name, c.module);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& c : modules_) out.push_back(c.module);
  return out;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (const auto& c : modules_) c.module->apply(fn);
  fn(*this);
  return *this;
}

Module& Module::train(bool mode) {
  training_ = mode;
  for (const auto& c : modules_) c.module->train(mode);
  return *this;
}

// ---- state -----------------------------------------------------------------------------------

StateDict Module::state_dict(const std::string& prefix) const {
  StateDict sd;
  for (const auto& p : params_) sd[join_name(prefix, p.name)] = p.tensor.detach();
  for (const auto& b : buffers_)
    if (b.persistent) sd[join_name(prefix, b.name)] = b.tensor.detach();
  for (const auto& c : modules_) {
    StateDict sub = c.module->state_dict(join_name(prefix, c.name));
    sd.insert(sub.begin(), sub.end());
  }
  return sd;
}

LoadResult Module::load_state_dict(const StateDict& sd, bool strict) {
  // Destinations: the live tensors (not detached copies of the handles, whose data is the
  // same anyway) by FQN.
  std::vector<std::pair<std::string, Tensor>> dst;
  std::function<void(Module&, const std::string&)> walk = [&](Module& m, const std::string& pre) {
    for (const auto& p : m.params_) dst.emplace_back(join_name(pre, p.name), p.tensor);
    for (const auto& b : m.buffers_)
      if (b.persistent) dst.emplace_back(join_name(pre, b.name), b.tensor);
    for (const auto& c : m.modules_) walk(*c.module, join_name(pre, c.name));
  };
  walk(*this, "");

  LoadResult res;
  std::vector<std::string> mismatches;
  std::vector<std::string> known;
  for (const auto& [k, t] : dst) {
    known.push_back(k);
    auto it = sd.find(k);
    if (it == sd.end()) {
      res.missing_keys.push_back(k);
      continue;
    }
    DTR_CHECK(it->second.defined(), "load_state_dict: value for \"", k, "\" is undefined");
    if (it->second.sizes() != t.sizes()) {
      std::ostringstream os;
      os << "size mismatch for " << k << ": copying a param with shape " << it->second.sizes()
         << " from checkpoint, the shape in current model is " << t.sizes();
      mismatches.push_back(os.str());
    }
  }
  std::sort(known.begin(), known.end());
  for (const auto& [k, t] : sd)
    if (!std::binary_search(known.begin(), known.end(), k)) res.unexpected_keys.push_back(k);

  std::ostringstream err;
  if (strict && !res.missing_keys.empty()) err << " Missing key(s) in state_dict: " << join_list(res.missing_keys) << ".";
  if (strict && !res.unexpected_keys.empty())
    err << " Unexpected key(s) in state_dict: " << join_list(res.unexpected_keys) << ".";
  for (const auto& m : mismatches) err << " " << m << ".";
  DTR_CHECK(err.str().empty(), "load_state_dict: error(s) in loading state_dict for ", type_name(), ":", err.str());

  NoGradGuard no_grad;
  for (auto& [k, t] : dst) {
    auto it = sd.find(k);
    if (it == sd.end() || it->second.is_same(t)) continue;
    t.copy_(it->second);
  }
  return res;
}

// ---- composable API state ----------------------------------------------------------------------

std::shared_ptr<ModuleState> Module::composable_state(const std::string& key) const {
  auto it = composable_states_.find(key);
  return it == composable_states_.end() ? nullptr : it->second;
}

void Module::set_composable_state(const std::string& key, std::shared_ptr<ModuleState> state) {
  DTR_CHECK(state != nullptr, "set_composable_state(\"", key, "\"): null state for this ", type_name());
  DTR_CHECK(!composable_states_.count(key), key, ": already applied to this ", type_name(),
            " module (each composable API can be applied to a module once)");
  composable_states_[key] = std::move(state);
}

std::vector<std::string> Module::composable_state_keys() const {
  std::vector<std::string> keys;
  for (const auto& [k, s] : composable_states_) keys.push_back(k);
  return keys;
}

}  // namespace dtr::nn
