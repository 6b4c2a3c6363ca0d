#include "dtensor/rules/common.h"

#include <algorithm>

namespace dtr::rules {

Placements map_to_input(const Placements& out_pl, const Shape& out, const Shape& in) {
  Placements r = out_pl;
  const int64_t lead = static_cast<int64_t>(out.size()) - static_cast<int64_t>(in.size());
  for (auto& p : r) {
    if (!p.shards()) continue;
    const int64_t jd = p.dim - lead;
    if (jd < 0 || (in[jd] == 1 && out[p.dim] != 1)) p = Replicate();
    else p.dim = jd;  // Shard or StridedShard alike (the dim has the output's size)
  }
  return r;
}

Shape local_shape_of(const DeviceMesh& mesh, const Shape& shape, const Placements& pl) {
  Shape ls, off;
  local_shape_and_offset(shape, mesh.shape(), pl, mesh.get_coordinate(), ls, off);
  return ls;
}

ShardingDecision decide(const OpSchema& s, const std::vector<Strategy>& candidates, std::vector<Shape> out_shapes) {
  const Strategy& best = choose_strategy(s, candidates);
  ShardingDecision d;
  d.input_placements = best.inputs;
  d.output_placements = best.outputs;
  d.output_shapes = std::move(out_shapes);
  return d;
}

Placements partial_to_replicate_unless(const Placements& p, std::initializer_list<ReduceOp> keep) {
  Placements out = p;
  for (auto& x : out)
    if (x.is_partial() && std::find(keep.begin(), keep.end(), x.reduce) == keep.end()) x = Replicate();
  return out;
}

}  // namespace dtr::rules
