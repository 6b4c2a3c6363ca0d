// Sharding rule of cat {x0, x1, ...} attrs {dim}. Per mesh dim: a shard of the cat dim is
// brought to Replicate; a Shard(k) (k != dim) is kept when every input is Shard(k) or
// Replicate there (R -> S is a local chunk; all inputs have the same size on k, so chunks line
// up); Partial(sum) is kept when every input is Partial(sum) (cat is linear); anything else
// -> Replicate. split / chunk are narrow views: covered by the slice rule (rules/view.cpp),
// which is also cat's backward. Source: PyTorch torch.distributed.tensor._ops._tensor_ops
// (cat_strategy).
#include <optional>

#include "dtensor/rules/nn_util.h"

namespace dtr::rules {
namespace {

ShardingDecision rule_cat(const OpSchema& s) {
  const int64_t dim = s.call.i(0);
  const int nd = s.mesh.ndim();
  Placements pl(nd, Replicate());
  for (int m = 0; m < nd; ++m) {
    std::optional<Placement> pick;
    bool all_partial = true, ok = true;
    for (const DTensorSpec* sp : s.specs) {
      if (!sp) continue;
      const Placement& p = sp->placements[m];
      all_partial = all_partial && p.is_partial() && p.reduce == ReduceOp::SUM;
      if (p.is_replicate()) continue;
      if (!p.is_shard() || p.dim == dim || (pick && *pick != p)) ok = false;
      else pick = p;
    }
    if (all_partial) pl[m] = Partial(ReduceOp::SUM);
    else if (ok && pick) pl[m] = *pick;
  }
  Shape out;
  for (const DTensorSpec* sp : s.specs) {
    if (!sp) continue;
    if (out.empty()) out = sp->shape;
    else out[dim] += sp->shape[dim];
  }
  ShardingDecision d;
  for (const DTensorSpec* sp : s.specs) d.input_placements.push_back(sp ? pl : Placements{});
  d.output_placements = {pl};
  d.output_shapes = {out};
  return d;
}

DTR_REGISTER_SHARDING_RULE("cat", rule_cat);

}  // namespace
}  // namespace dtr::rules
