#pragma once
// Autograd graph nodes: a Node turns the gradients of its op's outputs into gradients of the
// op's inputs; edges point to the nodes that produced the inputs (or to AccumulateGrad for
// leaves). Source: PyTorch's autograd Node / Edge / AccumulateGrad design.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace dtr {

struct Node;

/// Where a gradient flows: input `input_nr` of node `fn` (null fn: input needs no grad).
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
};

/// A node of the backward graph.
struct Node : std::enable_shared_from_this<Node> {
  Node();
  virtual ~Node() = default;
  /// Gradients of the inputs (one per next edge) from the gradients of the outputs
  /// (one per output; undefined where an output received no gradient).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  /// Frees saved tensors after backward (unless retain_graph).
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  /// Hooks on the gradient of output i (Tensor::register_hook on a non-leaf).
  std::vector<std::vector<GradHook>> output_hooks;
  uint32_t num_outputs = 1;
  /// Creation order; backward runs later nodes first when several are ready.
  uint64_t sequence_nr = 0;
};

/// Saves a tensor for backward together with its version, so that an in-place change
/// between forward and backward is detected (like PyTorch's SavedVariable).
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  /// The saved tensor; throws dtr::Error naming `op` when it was modified in place since.
  Tensor get(const char* op) const;
  const Shape& sizes() const { return sizes_; }
  bool defined() const { return t_.defined(); }

 private:
  Tensor t_;
  uint32_t version_ = 0;
  Shape sizes_;
};

/// Backward function of a recorded op: (grad_outputs, needs_input_grad) -> grad_inputs.
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads,
                                                     const std::vector<bool>& needs)>;

/// True when grad mode is on and any defined input requires grad.
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

/// Records an op in the graph: creates a node named `name` whose next edges point to the
/// inputs' gradient edges and makes it the grad_fn of `outputs`. Call only when needs_grad().
void record(const char* name, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs, BackwardFn fn);
void record(const char* name, const std::vector<Tensor>& inputs, Tensor& output, BackwardFn fn);

/// The edge a gradient for `t` flows into (its grad_fn output, or its AccumulateGrad).
Edge gradient_edge(const Tensor& t);

/// Runs backprop from `roots` with gradients `grads` (same length). Source: PyTorch engine
/// (dependency counting, ready queue ordered by sequence number).
/// Errors: a root that does not require grad; backward through a freed graph.
/// A backward started while another runs on the same thread (activation checkpointing's
/// recomputation) is nested: it runs its graph only; the outermost call runs the callbacks.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph);

/// Queues `fn` to run once at the end of the outermost backward running on this thread, after
/// every node of its graph ran (nested backwards do not run it). Callbacks run in the order they
/// were queued; one may queue more (they run in the same pass). When the backward (or a
/// callback) throws, the callbacks not run yet are dropped, never left for a later backward.
/// Source: PyTorch's Variable._execution_engine.queue_callback, used by FSDP2's post-backward
/// final callback and DDP's finalize_backward. Errors: called outside a backward.
void queue_callback(std::function<void()> fn);

/// Id of the outermost backward running on this thread (1, 2, ... per call), 0 outside
/// backward: an API that queues one callback per backward remembers the id it queued for.
uint64_t current_backward_id();

}  // namespace dtr
