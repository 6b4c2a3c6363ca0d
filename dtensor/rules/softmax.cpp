// Sharding rules of softmax / log_softmax and their backward ops: the softmax dim must be
// whole (Shard on it -> Replicate), Partial -> Replicate (softmax is not linear), shards of
// other dims follow. Backward ops {g, y}: both brought to the cheaper of g's and y's cleaned
// placements. Source: PyTorch torch.distributed.tensor._ops._math_ops (softmax_strategy).
#include "dtensor/rules/nn_util.h"

namespace dtr::rules {
namespace {

ShardingDecision rule_softmax(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  const Placements pl = shard_only(x.placements, {s.call.i(0)});
  ShardingDecision d;
  d.input_placements = {pl};
  d.output_placements = {pl};
  d.output_shapes = {x.shape};
  return d;
}

/// softmax_backward / log_softmax_backward: inputs {g, y}, attrs {dim}.
ShardingDecision rule_softmax_backward(const OpSchema& s) {
  const int64_t dim = s.call.i(0);
  const Placements pl =
      cheapest(s, {shard_only(s.spec(1).placements, {dim}), shard_only(s.spec(0).placements, {dim})}, {0, 1});
  ShardingDecision d;
  d.input_placements = {pl, pl};
  d.output_placements = {pl};
  d.output_shapes = {s.spec(1).shape};
  return d;
}

DTR_REGISTER_SHARDING_RULE("softmax", rule_softmax);
DTR_REGISTER_SHARDING_RULE("log_softmax", rule_softmax);
DTR_REGISTER_SHARDING_RULE("softmax_backward", rule_softmax_backward);
DTR_REGISTER_SHARDING_RULE("log_softmax_backward", rule_softmax_backward);

}  // namespace
}  // namespace dtr::rules
