// Sharding rules of reductions: a shard on a reduced dim becomes Partial (sum -> sum, amax ->
// max) with no communication; shards on kept dims move to the output dim; Partial(sum)
// survives sum, Partial(max) survives amax, other Partials are reduced first. mean is sum /
// count (count = global size), so uneven shards give the exact mean.
// all / any (logical and / or, bool out): a reduced shard becomes Partial(min) / Partial(max),
// reduced with MIN / MAX over the mesh, never a sum (PyTorch maps them to a sum); an empty
// shard gives the identity (true / false). Partial inputs are reduced first (min(-3, 0) is
// nonzero, and(-3, 0) is false), except a bool Partial of the same op.
// max along a dim with indices needs that dim whole (indices are global). sum / amax / all / any
// take StridedShard inputs as they are (a strided shard of a reduced dim becomes Partial too).
// Source: PyTorch torch.distributed.tensor._ops._math_ops.
#include <algorithm>

#include "dtensor/rules/common.h"

namespace dtr::rules {
namespace {

/// Output dim of input dim d after reducing `dims` (or -1 when d is reduced).
int64_t out_dim(int64_t d, const Shape& dims, bool keepdim) {
  if (std::count(dims.begin(), dims.end(), d)) return -1;
  if (keepdim) return d;
  return d - std::count_if(dims.begin(), dims.end(), [d](int64_t r) { return r < d; });
}

/// True when some rank of the mesh holds an empty slice of tensor dim d.
bool some_shard_empty(const DTensorSpec& x, int64_t d) {
  const Shape& ms = x.mesh.shape();
  std::vector<int64_t> coord(ms.size(), 0);
  for (int64_t r = 0; r < x.mesh.size(); ++r) {
    int64_t rem = r;
    for (size_t i = ms.size(); i-- > 0;) {
      coord[i] = rem % ms[i];
      rem /= ms[i];
    }
    Shape ls, off;
    local_shape_and_offset(x.shape, ms, x.placements, coord, ls, off);
    if (ls[d] == 0) return true;
  }
  return false;
}

/// sum / amax (`logical` false) and all / any (`logical` true) over attrs {dims, keepdim}.
ShardingDecision reduce_rule(const OpSchema& s, ReduceOp partial_op, bool logical = false) {
  const DTensorSpec& x = s.spec(0);
  // Partial inputs that survive: Partial(sum / avg) under sum, Partial(max) under amax, a bool
  // Partial(min) / Partial(max) under all / any.
  auto keeps = [&](const Placement& p) {
    if (logical) return p.reduce == partial_op && x.dtype == DType::bool_;
    return p.reduce == partial_op || (partial_op == ReduceOp::SUM && p.reduce == ReduceOp::AVG);
  };
  const Shape dims = reduction_dims(s.call.shape(0), static_cast<int64_t>(x.shape.size()), s.call.name());
  const bool keepdim = s.call.b(1);
  Placements in = x.placements, out = x.placements;
  for (size_t i = 0; i < in.size(); ++i) {
    const Placement& p = in[i];
    // max / min have no identity for an empty shard: gather that dim instead.
    if (p.shards() && partial_op != ReduceOp::SUM && !logical && out_dim(p.dim, dims, keepdim) < 0 &&
        some_shard_empty(x, p.dim)) {
      in[i] = out[i] = Replicate();
      continue;
    }
    if (p.shards()) {  // Shard or StridedShard: the local rows partition the dim either way
      const int64_t od = out_dim(p.dim, dims, keepdim);
      if (od < 0) out[i] = Partial(partial_op);
      else out[i].dim = od;
    } else if (p.is_partial() && !keeps(p)) {
      in[i] = Replicate();
      out[i] = Replicate();
    }
  }
  ShardingDecision d;
  d.input_placements = {in};
  d.output_placements = {out};
  d.output_shapes = {reduced_shape(x.shape, dims, keepdim)};
  return d;
}

ShardingDecision rule_sum(const OpSchema& s) { return reduce_rule(s, ReduceOp::SUM); }
ShardingDecision rule_amax(const OpSchema& s) { return reduce_rule(s, ReduceOp::MAX); }
ShardingDecision rule_all(const OpSchema& s) { return reduce_rule(s, ReduceOp::MIN, true); }
ShardingDecision rule_any(const OpSchema& s) { return reduce_rule(s, ReduceOp::MAX, true); }

ShardingDecision rule_max_dim(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  const int64_t nd = static_cast<int64_t>(x.shape.size());
  const int64_t d = wrap_dim(s.call.i(0), nd, "max");
  const bool keepdim = s.call.b(1);
  Placements in = without_partial(x.placements), out = in;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].is_shard()) continue;
    if (in[i].dim == d) {
      in[i] = out[i] = Replicate();
    } else {
      out[i] = Shard(out_dim(in[i].dim, {d}, keepdim));
    }
  }
  ShardingDecision dec;
  dec.input_placements = {in};
  dec.output_placements = {out, out};
  Shape os = reduced_shape(x.shape, nd ? Shape{d} : Shape{}, keepdim);
  dec.output_shapes = {os, os};
  return dec;
}

/// max_dim_backward(g, idx; in_shape, d): g and idx have keepdim shape; output the input shape.
ShardingDecision rule_max_dim_backward(const OpSchema& s) {
  const DTensorSpec& g = s.spec(0);
  const int64_t d = s.call.i(1);
  Placements pl = without_partial(g.placements);
  for (auto& p : pl)
    if (p.is_shard(d)) p = Replicate();
  ShardingDecision dec;
  dec.input_placements = {pl, pl};
  dec.output_placements = {pl};
  dec.output_shapes = {s.call.shape(0)};
  dec.rewrite_attrs = true;
  dec.local_attrs = {local_shape_of(s.mesh, s.call.shape(0), pl), d};
  return dec;
}

DTR_REGISTER_STRIDED_SHARDING_RULE("sum", rule_sum);
DTR_REGISTER_STRIDED_SHARDING_RULE("amax", rule_amax);
DTR_REGISTER_STRIDED_SHARDING_RULE("all", rule_all);
DTR_REGISTER_STRIDED_SHARDING_RULE("any", rule_any);
DTR_REGISTER_SHARDING_RULE("max_dim", rule_max_dim);
DTR_REGISTER_SHARDING_RULE("max_dim_backward", rule_max_dim_backward);

}  // namespace
}  // namespace dtr::rules
