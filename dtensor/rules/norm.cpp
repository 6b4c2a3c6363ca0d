// Sharding rules of rms_norm and rms_norm_backward. The normalised (last) dim must be whole;
// rows may be sharded on any other dim (e.g. sequence parallel: x Shard(1) on [B, T, H]);
// Partial x -> Replicate; weight Replicate. Backward {g, x, w} -> {dx, dweight}: dx like x;
// dweight is a sum over rows, so it is Partial(sum) on every mesh dim that shards rows
// (reduced when it reaches the leaf), Replicate elsewhere.
// Source: PyTorch torch.distributed.tensor._ops._math_ops (layer_norm / rms_norm strategies).
#include "dtensor/rules/nn_util.h"

namespace dtr::rules {
namespace {

ShardingDecision rule_rms_norm(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  const Placements pl = shard_only(x.placements, {s.ndim(0) - 1});
  ShardingDecision d;
  d.input_placements = {pl, replicate_all(s.mesh.ndim())};
  d.output_placements = {pl};
  d.output_shapes = {x.shape};
  return d;
}

/// inputs {g, x, w}, attrs {eps} -> {dx, dw}.
ShardingDecision rule_rms_norm_backward(const OpSchema& s) {
  const DTensorSpec& x = s.spec(1);
  const int64_t last = s.ndim(1) - 1;
  const Placements pl = cheapest(s, {shard_only(x.placements, {last}), shard_only(s.spec(0).placements, {last})}, {0, 1});
  Placements dw(pl.size(), Replicate());
  for (size_t i = 0; i < pl.size(); ++i)
    if (pl[i].is_shard()) dw[i] = Partial(ReduceOp::SUM);
  ShardingDecision d;
  d.input_placements = {pl, pl, replicate_all(s.mesh.ndim())};
  d.output_placements = {pl, dw};
  d.output_shapes = {x.shape, {x.shape.empty() ? 1 : x.shape.back()}};
  return d;
}

DTR_REGISTER_SHARDING_RULE("rms_norm", rule_rms_norm);
DTR_REGISTER_SHARDING_RULE("rms_norm_backward", rule_rms_norm_backward);

}  // namespace
}  // namespace dtr::rules
