// Sharding rule of dropout {x} attrs {p, seed, offset}: every shard regenerates exactly its
// slice of the single-process mask (element i of the global tensor keeps when
// philox_uniform(seed, offset + global_linear_index) >= p). The local kernel gets two more
// attrs: the global shape and this rank's global offset per dim, from which it computes the
// global linear index of each local element. Partial x is reduced first (the brief's choice:
// the mask is applied to the value, not to the pending terms); StridedShard -> Replicate.
// The backward is the same op on the gradient. Source: dtr's dropout op (Philox counter
// mask, as in PyTorch's CUDA dropout and DTensor's OffsetBasedRNGTracker).
#include "dtensor/rules/nn_util.h"

namespace dtr::rules {
namespace {

ShardingDecision rule_dropout(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  const Placements pl = shard_only(x.placements);
  ShardingDecision d;
  d.input_placements = {pl};
  d.output_placements = {pl};
  d.output_shapes = {x.shape};
  d.rewrite_attrs = true;
  d.local_attrs = {s.call.attrs.at(0), s.call.attrs.at(1), s.call.attrs.at(2), x.shape,
                   local_offset_of(s.mesh, x.shape, pl)};
  return d;
}

DTR_REGISTER_SHARDING_RULE("dropout", rule_dropout);

}  // namespace
}  // namespace dtr::rules
