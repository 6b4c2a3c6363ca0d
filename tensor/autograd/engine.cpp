// Autograd graph recording and the backward engine.
#include <atomic>
#include <queue>
#include <unordered_map>

#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

std::atomic<uint64_t> g_next_sequence{0};

// End-of-backward callbacks (queue_callback): per thread, like PyTorch's per-graph-task list.
thread_local int t_backward_depth = 0;
thread_local uint64_t t_backward_id = 0;  // id of the outermost backward running, 0 outside
thread_local uint64_t t_backward_count = 0;
thread_local std::vector<std::function<void()>> t_final_callbacks;

/// Tracks the nesting of run_backward; the outermost scope drops what is left queued when it is
/// left by an exception (and after the callbacks ran).
struct BackwardScope {
  BackwardScope() {
    if (t_backward_depth++ == 0) {
      t_final_callbacks.clear();
      t_backward_id = ++t_backward_count;
    }
  }
  ~BackwardScope() {
    if (--t_backward_depth == 0) {
      t_final_callbacks.clear();
      t_backward_id = 0;
    }
  }
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;
  bool outermost() const { return t_backward_depth == 1; }
};

/// Runs the queued callbacks in order, including those queued by a callback.
void run_final_callbacks() {
  for (size_t i = 0; i < t_final_callbacks.size(); ++i) {
    std::function<void()> fn = std::move(t_final_callbacks[i]);
    fn();
  }
  t_final_callbacks.clear();
}

/// The node of a recorded op: calls the op's backward closure.
struct FunctionNode final : Node {
  std::string op;
  BackwardFn fn;
  std::vector<bool> needs;
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    DTR_CHECK(fn != nullptr, "backward through ", op,
              " a second time: its saved tensors were freed (pass retain_graph=true to the first backward)");
    std::vector<Tensor> out = fn(grads, needs);
    DTR_CHECK(out.size() == next_edges.size(), op, " backward returned ", out.size(), " gradients for ",
              next_edges.size(), " inputs");
    return out;
  }
  std::string name() const override { return op + "Backward"; }
  void release_saved() override { fn = nullptr; }
};

/// Accumulates the gradient of a leaf into its .grad and runs its hooks.
struct AccumulateGrad final : Node {
  std::weak_ptr<TensorImpl> leaf;
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    auto impl = leaf.lock();
    if (!impl || !grads[0].defined()) return {};
    Tensor var(impl);
    Tensor g = grads[0];
    AutogradMeta& meta = impl->autograd_meta();
    for (auto& h : meta.hooks) {
      Tensor r = h(g);
      if (r.defined()) g = r;
    }
    if ((var.is_distributed() || g.is_distributed()) && distributed_dispatcher())
      g = distributed_dispatcher()->grad_for_leaf(var, g);
    DTR_CHECK(g.sizes() == var.sizes(), "AccumulateGrad: gradient of shape ", g.sizes(), " for leaf of shape ",
              var.sizes());
    if (g.dtype() != var.dtype()) g = g.to(var.dtype());
    if (!meta.grad.defined()) {
      // Steal the buffer when nothing else references it, otherwise copy: a later in-place
      // update of .grad must never write into another tensor.
      const bool sole = g.impl_ptr().use_count() <= 2 && (!g.storage() || g.storage().use_count() == 1);
      meta.grad = sole ? g.detach() : g.clone();
    } else {
      meta.grad = add(meta.grad, g);
    }
    for (auto& h : meta.post_acc_hooks) h(var);
    return {};
  }
  std::string name() const override { return "AccumulateGrad"; }
};

std::shared_ptr<Node> grad_accumulator(const Tensor& t) {
  AutogradMeta& meta = t.impl()->autograd_meta();
  if (auto acc = meta.grad_accumulator.lock()) return acc;
  auto acc = std::make_shared<AccumulateGrad>();
  acc->leaf = t.impl_ptr();
  meta.grad_accumulator = acc;
  return acc;
}

}  // namespace

Node::Node() : sequence_nr(g_next_sequence.fetch_add(1)) {}

SavedTensor::SavedTensor(const Tensor& t) : t_(t), version_(t.defined() ? t.version() : 0) {
  if (t.defined()) sizes_ = t.sizes();
}

Tensor SavedTensor::get(const char* op) const {
  if (t_.defined()) {
    DTR_CHECK(t_.version() == version_, op,
              ": a tensor saved for backward was modified by an in-place operation (version ", t_.version(),
              ", expected ", version_, ")");
  }
  return t_;
}

bool needs_grad(std::initializer_list<Tensor> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  const auto& fn = t.grad_fn();
  if (fn) return {fn, t.impl()->autograd->output_nr};
  return {grad_accumulator(t), 0};
}

void record(const char* name, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs, BackwardFn fn) {
  auto node = std::make_shared<FunctionNode>();
  node->op = name;
  node->fn = std::move(fn);
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    node->next_edges.push_back(gradient_edge(t));
    node->needs.push_back(node->next_edges.back().fn != nullptr);
  }
  node->num_outputs = static_cast<uint32_t>(outputs.size());
  node->output_hooks.resize(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& o = outputs[i];
    if (!o.defined() || !is_floating(o.dtype())) continue;
    AutogradMeta& meta = o.impl()->autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(i);
  }
}

void record(const char* name, const std::vector<Tensor>& inputs, Tensor& output, BackwardFn fn) {
  std::vector<Tensor> outs{output};
  record(name, inputs, outs, std::move(fn));
}

void queue_callback(std::function<void()> fn) {
  DTR_CHECK(t_backward_depth > 0, "queue_callback: final callbacks can only be queued during backward");
  DTR_CHECK(fn != nullptr, "queue_callback: empty callback");
  t_final_callbacks.push_back(std::move(fn));
}

uint64_t current_backward_id() { return t_backward_id; }

namespace {
/// The graph part of run_backward: dependency counts, then nodes in ready order.
void run_graph(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  DTR_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(), " gradients");
  NoGradGuard no_grad;
  // 1. Dependency counts over the graph reachable from the roots.
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::vector<std::shared_ptr<Node>> stack;
  std::vector<Edge> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    DTR_CHECK(roots[i].requires_grad(), "backward: tensor of shape ", roots[i].sizes(),
              " does not require grad and has no grad_fn");
    Edge e = gradient_edge(roots[i]);
    root_edges.push_back(e);
    if (!deps.count(e.fn.get())) {
      deps[e.fn.get()] = 0;
      stack.push_back(e.fn);
    }
  }
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;  // owns nodes while we run
  while (!stack.empty()) {
    auto n = stack.back();
    stack.pop_back();
    keep[n.get()] = n;
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      auto it = deps.find(e.fn.get());
      if (it == deps.end()) {
        deps[e.fn.get()] = 1;
        stack.push_back(e.fn);
      } else {
        ++it->second;
      }
    }
  }
  // 2. Seed the root gradients.
  auto add_grad = [&](Node* n, uint32_t slot, const Tensor& g) {
    auto& buf = buffers[n];
    if (buf.size() < n->num_outputs) buf.resize(n->num_outputs);
    DTR_CHECK(slot < buf.size(), "backward: gradient slot ", slot, " out of range for ", n->name());
    buf[slot] = buf[slot].defined() ? add(buf[slot], g) : g;
  };
  for (size_t i = 0; i < roots.size(); ++i) add_grad(root_edges[i].fn.get(), root_edges[i].input_nr, grads[i]);
  auto cmp = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(cmp)> ready(cmp);
  for (auto& e : root_edges)
    if (deps[e.fn.get()] == 0) {
      deps[e.fn.get()] = -1;  // queued
      ready.push(e.fn.get());
    }
  // 3. Run nodes whose gradients are complete.
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> g = std::move(buffers[n]);
    buffers.erase(n);
    g.resize(n->num_outputs);
    for (uint32_t i = 0; i < n->output_hooks.size() && i < g.size(); ++i)
      for (auto& h : n->output_hooks[i])
        if (g[i].defined()) {
          Tensor r = h(g[i]);
          if (r.defined()) g[i] = r;
        }
    std::vector<Tensor> out = n->apply(std::move(g));
    if (!retain_graph) n->release_saved();
    for (size_t k = 0; k < n->next_edges.size(); ++k) {
      const Edge& e = n->next_edges[k];
      if (!e.fn) continue;
      if (k < out.size() && out[k].defined()) add_grad(e.fn.get(), e.input_nr, out[k]);
      if (--deps[e.fn.get()] == 0) {
        deps[e.fn.get()] = -1;
        ready.push(e.fn.get());
      }
    }
  }
}
}  // namespace

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  BackwardScope scope;
  run_graph(roots, grads, retain_graph);
  if (scope.outermost()) {
    NoGradGuard no_grad;
    run_final_callbacks();
  }
}

}  // namespace dtr
