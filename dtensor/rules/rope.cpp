// Sharding rules of rotary_embedding {x, cos, sin} and rotary_embedding_backward {g, cos, sin}.
// x [..., D] (usually [B, H, T, D]) keeps its shards on any dim but the rotated last one
// (batch, heads = tensor parallel, or sequence); cos/sin follow x through broadcasting, so a
// sequence-sharded x takes the matching local slice of replicated tables (R -> S is a local
// chunk, no communication). The op is linear in x: Partial(sum / avg) x stays Partial with
// replicated tables. Source: PyTorch DTensor pointwise strategy applied to HF apply_rotary_pos_emb.
#include "dtensor/rules/nn_util.h"

namespace dtr::rules {
namespace {

ShardingDecision rule_rope(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  const int64_t last = s.ndim(0) - 1;
  Placements out = x.placements;
  for (auto& p : out) {
    const bool linear_partial = p.is_partial() && (p.reduce == ReduceOp::SUM || p.reduce == ReduceOp::AVG);
    if (!(p.is_shard() && p.dim != last) && !linear_partial) p = Replicate();
  }
  ShardingDecision d;
  d.input_placements = {out};
  for (size_t j = 1; j < 3; ++j) {
    Placements t = map_to_input(out, x.shape, s.spec(j).shape);
    for (auto& p : t)
      if (p.is_partial()) p = Replicate();
    d.input_placements.push_back(t);
  }
  d.output_placements = {out};
  d.output_shapes = {x.shape};
  return d;
}

DTR_REGISTER_SHARDING_RULE("rotary_embedding", rule_rope);
DTR_REGISTER_SHARDING_RULE("rotary_embedding_backward", rule_rope);

}  // namespace
}  // namespace dtr::rules
