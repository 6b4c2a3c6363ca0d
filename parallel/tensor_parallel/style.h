#pragma once
// Tensor-parallel styles: how one module's parameters are distributed on the TP mesh and how
// its inputs / outputs are redistributed around its forward. Semantics of PyTorch's
// torch.distributed.tensor.parallel styles, plus NeMo Automodel's LoRA-aware variants.
//   ColwiseParallel      Linear weight/bias Shard(0), Embedding weight Shard(1);
//                        input Replicate, output Shard(-1), use_local_output true
//   RowwiseParallel      Linear weight Shard(1), bias Replicate, Embedding weight Shard(0);
//                        input Shard(-1) (Embedding: Replicate), output Replicate
//   SequenceParallel     parameters Replicate (no communication), input/output Shard(seq_dim)
//   PrepareModuleInput / PrepareModuleOutput: layouts only
//   ColwiseParallelLora  + lora_A.weight, lora_B.weight Shard(0); lora_A's output -> Replicate
//   RowwiseParallelLora  + lora_A.weight Shard(1), lora_B.weight Shard(1); scale between A and B
//                        keeps the branch Partial so one reduction serves base + adapter
//   SequenceParallelLora parameters Replicate, requires_grad kept
// No style changes requires_grad of any parameter.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/api.h"
#include "tensor/nn/module.h"

namespace dtr {

/// Distributed copies of parameters made during one parallelize_module call, keyed by the
/// original tensor, so a tensor reached twice (tied weights) is distributed once and stays tied.
struct DistributeMemo {
  std::map<const TensorImpl*, Tensor> done;
};

/// Base of all styles. Styles are small value-like objects: `clone()` copies the settings.
class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  /// Class name, e.g. "ColwiseParallel" (translate_to_lora swaps by exact type).
  virtual std::string type_name() const = 0;
  /// Distributes `module`'s parameters and installs its input/output hooks. `fqn` names the
  /// module in messages. Errors: a module type the style does not support.
  virtual void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) = 0;
  virtual std::shared_ptr<ParallelStyle> clone() const = 0;

  /// Layout settings (PyTorch's input_layouts / output_layouts / use_local_output).
  std::optional<Placement> input_layout;
  std::optional<Placement> desired_input_layout;
  std::optional<Placement> output_layout;
  bool use_local_output = true;
};

/// Settings common to Colwise / Rowwise (and their LoRA variants).
class ColwiseParallel : public ParallelStyle {
 public:
  explicit ColwiseParallel(std::optional<Placement> input_layouts = std::nullopt,
                           std::optional<Placement> output_layouts = std::nullopt, bool use_local_output = true);
  std::string type_name() const override { return "ColwiseParallel"; }
  void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) override;
  std::shared_ptr<ParallelStyle> clone() const override { return std::make_shared<ColwiseParallel>(*this); }
};

class RowwiseParallel : public ParallelStyle {
 public:
  explicit RowwiseParallel(std::optional<Placement> input_layouts = std::nullopt,
                           std::optional<Placement> output_layouts = std::nullopt, bool use_local_output = true);
  std::string type_name() const override { return "RowwiseParallel"; }
  void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) override;
  std::shared_ptr<ParallelStyle> clone() const override { return std::make_shared<RowwiseParallel>(*this); }
};

/// Replicates the module's parameters (no communication, requires_grad kept) and runs it on
/// inputs sharded on `sequence_dim`; plain inputs are this rank's torch.chunk shard, wrapped with
/// the exact global length (tp::wrap_local_shard), so the length need not divide by tp.
class SequenceParallel : public ParallelStyle {
 public:
  explicit SequenceParallel(int64_t sequence_dim = 1, bool use_local_output = false);
  std::string type_name() const override { return "SequenceParallel"; }
  void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) override;
  std::shared_ptr<ParallelStyle> clone() const override { return std::make_shared<SequenceParallel>(*this); }
  int64_t sequence_dim;
};

/// Redistributes the module's first input from input_layouts to desired_input_layouts.
class PrepareModuleInput : public ParallelStyle {
 public:
  PrepareModuleInput(Placement input_layouts, Placement desired_input_layouts, bool use_local_output = false);
  std::string type_name() const override { return "PrepareModuleInput"; }
  void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) override;
  std::shared_ptr<ParallelStyle> clone() const override { return std::make_shared<PrepareModuleInput>(*this); }
};

/// Redistributes the module's first output from output_layouts to desired_output_layouts.
class PrepareModuleOutput : public ParallelStyle {
 public:
  PrepareModuleOutput(Placement output_layouts, Placement desired_output_layouts, bool use_local_output = true);
  std::string type_name() const override { return "PrepareModuleOutput"; }
  void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) override;
  std::shared_ptr<ParallelStyle> clone() const override { return std::make_shared<PrepareModuleOutput>(*this); }
  Placement desired_output_layout;
};

class ColwiseParallelLora : public ColwiseParallel {
 public:
  using ColwiseParallel::ColwiseParallel;
  explicit ColwiseParallelLora(const ColwiseParallel& base) : ColwiseParallel(base) {}
  std::string type_name() const override { return "ColwiseParallelLora"; }
  void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) override;
  std::shared_ptr<ParallelStyle> clone() const override { return std::make_shared<ColwiseParallelLora>(*this); }
};

class RowwiseParallelLora : public RowwiseParallel {
 public:
  using RowwiseParallel::RowwiseParallel;
  explicit RowwiseParallelLora(const RowwiseParallel& base) : RowwiseParallel(base) {}
  std::string type_name() const override { return "RowwiseParallelLora"; }
  void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) override;
  std::shared_ptr<ParallelStyle> clone() const override { return std::make_shared<RowwiseParallelLora>(*this); }
};

class SequenceParallelLora : public SequenceParallel {
 public:
  using SequenceParallel::SequenceParallel;
  explicit SequenceParallelLora(const SequenceParallel& base) : SequenceParallel(base) {}
  std::string type_name() const override { return "SequenceParallelLora"; }
  void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) override;
  std::shared_ptr<ParallelStyle> clone() const override { return std::make_shared<SequenceParallelLora>(*this); }
};

/// A TP plan: module FQN patterns ('*' matches within one dotted component) -> style, applied
/// in order.
using ParallelizePlan = std::vector<std::pair<std::string, std::shared_ptr<ParallelStyle>>>;

/// Swaps, by exact type, ColwiseParallel -> ColwiseParallelLora, RowwiseParallel ->
/// RowwiseParallelLora, SequenceParallel -> SequenceParallelLora, keeping their settings; other
/// styles (and LoRA styles already swapped) are left as they are. Returns the same plan object
/// (modified in place); idempotent. Source: NeMo Automodel translate_to_lora.
ParallelizePlan& translate_to_lora(ParallelizePlan& plan);

/// Applies `plan` to the module tree on the 1-d `tp_mesh`. Keys matching no module are
/// reported in one warning on rank 0 (listing them). Errors: tp_mesh not 1-d; a style on a
/// module type it does not support (naming FQN, type and style).
/// Source: torch.distributed.tensor.parallel.parallelize_module.
void parallelize_module(nn::Module& module, const DeviceMesh& tp_mesh, const ParallelizePlan& plan);

/// True when dotted `fqn` matches `pattern` component by component ('*' and '?' wildcards).
bool fqn_matches(const std::string& pattern, const std::string& fqn);

}  // namespace dtr
