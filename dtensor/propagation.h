#pragma once
// Sharding propagation: per-op rules (registered by op name, one file per op family under
// rules/) decide which placements an op's inputs need and which placements and global shapes
// its outputs get. Candidate strategies are ranked by redistribution cost; decisions are
// cached by op and *every* argument (shapes, dtypes, placements, mesh, all attributes incl.
// scalars). Source: PyTorch torch.distributed.tensor._sharding_prop / _ops, OneFlow SBP.
#include <functional>
#include <string>
#include <vector>

#include "dtensor/spec.h"
#include "tensor/dispatch.h"

namespace dtr {

/// What a rule sees: the call, the spec of each tensor input (plain tensors appear as
/// Replicate specs; undefined inputs as nullptr) and the mesh.
struct OpSchema {
  const OpCall& call;
  std::vector<const DTensorSpec*> specs;
  const DeviceMesh& mesh;
  const DTensorSpec& spec(size_t i) const { return *specs.at(i); }
  int64_t ndim(size_t i) const { return static_cast<int64_t>(specs.at(i)->shape.size()); }
};

/// Computes the local outputs from the redistributed local inputs, when the op is not just its
/// local kernel (e.g. loss parallel, vocab-parallel embedding).
using LocalFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& locals, const OpSchema& schema)>;

/// A rule's answer.
struct ShardingDecision {
  std::vector<Placements> input_placements;   // per input (ignored for undefined inputs)
  std::vector<Placements> output_placements;  // per output
  std::vector<Shape> output_shapes;           // global shapes per output
  bool rewrite_attrs = false;                 // run the local kernel with `local_attrs`
  std::vector<Attr> local_attrs;
  LocalFn local_fn;                           // overrides the local kernel when set
  bool inplace = false;                       // output 0 is input 0 (in-place op)
};

using ShardingRule = std::function<ShardingDecision(const OpSchema&)>;

/// How a rule meets strided shards (StridedShard, FSDP + TP parameters) among its inputs.
enum class StridedInputs : uint8_t {
  /// Default: the rule sees every StridedShard mesh dim as Replicate, and the dispatcher
  /// redistributes such inputs from their real placements to the ones the rule asks for (one
  /// all_gather over the dp dim for a [StridedShard(0, tp), Shard(0)] parameter).
  Replicate,
  /// The rule places StridedShard inputs itself (pointwise, reductions, transposes, in-place ops).
  Accept,
};

/// A registered rule and how it meets strided shards.
struct RuleEntry {
  ShardingRule rule;
  StridedInputs strided = StridedInputs::Replicate;
};

/// Registers the rule of op `name`.
void register_sharding_rule(const std::string& name, ShardingRule rule,
                            StridedInputs strided = StridedInputs::Replicate);
/// The rule of `name`, or nullptr.
const RuleEntry* find_sharding_rule(const std::string& name);
/// `s` with every StridedShard mesh dim replaced by Replicate (what a StridedInputs::Replicate
/// rule sees).
DTensorSpec without_strided(const DTensorSpec& s);

/// One candidate: input placements -> output placements.
struct Strategy {
  std::vector<Placements> inputs;
  std::vector<Placements> outputs;
};

/// Bytes moved to bring `from` to `to` (0 when equal or local-only), PyTorch's cost idea: the
/// sum of the plan's table entries' costs (Transition::cost: all_gather the gathered bytes,
/// reduce_scatter / all_to_all the local bytes, all_reduce twice them), the same on every rank.
/// Infinite when infeasible (a shard cannot become Partial).
double redistribute_cost(const DTensorSpec& from, const Placements& to);
/// The strategy with the lowest total input redistribution cost (first wins ties).
/// Errors (naming the op and input placements) when `candidates` is empty.
const Strategy& choose_strategy(const OpSchema& s, const std::vector<Strategy>& candidates);

/// Cartesian product helper: per mesh dim a list of single-dim options (one placement per
/// input and per output), combined over all mesh dims.
struct DimOption {
  std::vector<Placement> inputs;
  std::vector<Placement> outputs;
};
std::vector<Strategy> expand_strategies(const std::vector<std::vector<DimOption>>& per_mesh_dim, size_t n_in,
                                        size_t n_out);

/// Number of decisions served from the cache / computed, for tests and benchmarks.
struct PropagationStats {
  int64_t hits = 0;
  int64_t misses = 0;
};
PropagationStats propagation_stats();
void clear_propagation_cache();

#define DTR_REGISTER_SHARDING_RULE(name, fn) \
  static const bool DTR_CONCAT(dtr_rule_reg_, __LINE__) = (::dtr::register_sharding_rule(name, fn), true)
/// Registers a rule that places StridedShard inputs itself (StridedInputs::Accept).
#define DTR_REGISTER_STRIDED_SHARDING_RULE(name, fn) \
  static const bool DTR_CONCAT(dtr_rule_reg_, __LINE__) = \
      (::dtr::register_sharding_rule(name, fn, ::dtr::StridedInputs::Accept), true)

}  // namespace dtr
