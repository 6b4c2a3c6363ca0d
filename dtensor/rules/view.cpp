// Sharding rules of view ops. transpose / permute move shard dims; expand shifts them past new
// leading dims; slice of a sharded dim needs it whole; view / reshape use an exact dim map:
// input and output dims are grouped by equal products; a shard survives only on the first
// non-unit input dim of its group when it maps to the first non-unit output dim with a size
// divisible by the number of shards (flatten: the input dim; split: the first output piece).
// Anything else: reshape redistributes that mesh dim to Replicate, view raises. A shard of a
// size-1 dim is degenerate (coordinate 0 holds the tensor, the others hold nothing), so it moves
// to a size-1 output dim (the matching one of its group, else any; unsqueeze / squeeze of other
// dims), and only when the output has none (squeezing it away) is it gathered, by view too: the
// single process accepts the view and no other layout can express it. An empty tensor and a
// size-1 mesh dim are replicated (nothing moves). Strided shards (FSDP + TP) map like shards, a
// flatten / split keeping them when every piece of the dim (shards x lone strided blocks) is
// whole and equal.
// Source: PyTorch torch.distributed.tensor._ops._view_ops (dim maps).
#include "dtensor/rules/common.h"

namespace dtr::rules {
namespace {

ShardingDecision same_rank(const OpSchema& s, Placements in, Placements out, Shape out_shape) {
  ShardingDecision d;
  d.input_placements = {std::move(in)};
  d.output_placements = {std::move(out)};
  d.output_shapes = {std::move(out_shape)};
  return d;
}

ShardingDecision rule_transpose(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  const int64_t nd = static_cast<int64_t>(x.shape.size());
  const int64_t a = wrap_dim(s.call.i(0), nd, "transpose"), b = wrap_dim(s.call.i(1), nd, "transpose");
  Placements out = x.placements;
  for (auto& p : out)
    if (p.shards()) p.dim = p.dim == a ? b : (p.dim == b ? a : p.dim);
  Shape sh = x.shape;
  std::swap(sh[a], sh[b]);
  return same_rank(s, x.placements, out, sh);
}

ShardingDecision rule_permute(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  const int64_t nd = static_cast<int64_t>(x.shape.size());
  const Shape& dims = s.call.shape(0);
  Shape inv(nd), sh(nd);
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t d = wrap_dim(dims.at(i), nd, "permute");
    inv[d] = i;
    sh[i] = x.shape[d];
  }
  Placements out = x.placements;
  for (auto& p : out)
    if (p.shards()) p.dim = inv[p.dim];
  return same_rank(s, x.placements, out, sh);
}

ShardingDecision rule_slice(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  const int64_t d = s.call.i(0), start = s.call.i(1), end = s.call.i(2), step = s.call.i(3);
  Placements in = x.placements;
  for (auto& p : in)
    if (p.is_shard(d)) p = Replicate();
  Shape sh = x.shape;
  sh[d] = (end - start + step - 1) / step;
  return same_rank(s, in, in, sh);
}

ShardingDecision rule_slice_backward(const OpSchema& s) {
  const DTensorSpec& g = s.spec(0);
  const Shape& in_shape = s.call.shape(0);
  const int64_t d = s.call.i(1);
  Placements pl = g.placements;
  for (auto& p : pl)
    if (p.is_shard(d)) p = Replicate();
  ShardingDecision dec = same_rank(s, pl, pl, in_shape);
  dec.rewrite_attrs = true;
  dec.local_attrs = s.call.attrs;
  dec.local_attrs[0] = local_shape_of(s.mesh, in_shape, pl);
  return dec;
}

ShardingDecision rule_expand(const OpSchema& s) {
  const DTensorSpec& x = s.spec(0);
  const Shape& target = s.call.shape(0);
  const int64_t lead = static_cast<int64_t>(target.size()) - static_cast<int64_t>(x.shape.size());
  Shape out_shape(target.size());
  for (size_t i = 0; i < target.size(); ++i)
    out_shape[i] = (static_cast<int64_t>(i) >= lead && target[i] == -1) ? x.shape[i - lead] : target[i];
  Placements in = x.placements, out = x.placements;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].is_shard()) continue;
    const int64_t d = in[i].dim;
    if (x.shape[d] == 1 && out_shape[d + lead] != 1) in[i] = out[i] = Replicate();
    else out[i] = Shard(d + lead);
  }
  ShardingDecision dec = same_rank(s, in, out, out_shape);
  dec.rewrite_attrs = true;
  dec.local_attrs = {local_shape_of(s.mesh, out_shape, out)};
  return dec;
}

Shape infer_target(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) infer = static_cast<int>(i);
    else known *= out[i];
  }
  if (infer >= 0) out[infer] = known ? numel / known : 0;
  DTR_CHECK(shape_numel(out) == numel, op, ": shape ", shape, " is invalid for input of shape ", from);
  return out;
}

ShardingDecision view_rule(const OpSchema& s, bool strict) {
  const DTensorSpec& x = s.spec(0);
  const Shape& in = x.shape;
  const Shape out = infer_target(s.call.shape(0), shape_numel(in), s.call.name(), in);
  const int nd = s.mesh.ndim();
  Placements in_pl = x.placements, out_pl = x.placements;
  // Group dims by equal products.
  std::vector<int64_t> group_of_in(in.size(), -1);
  std::vector<std::pair<int64_t, int64_t>> first_out;  // per group: first non-unit out dim, out size
  std::vector<int64_t> first_in;                        // per group: first non-unit in dim
  std::vector<int64_t> unit_rank_in(in.size(), -1);     // k for the k-th size-1 in dim of its group
  std::vector<std::vector<int64_t>> unit_out;           // per group: its size-1 out dims
  size_t i = 0, j = 0;
  const bool empty = shape_numel(in) == 0;
  while (!empty && (i < in.size() || j < out.size())) {
    int64_t pi = 1, pj = 1;
    const size_t i0 = i, j0 = j;
    if (i < in.size()) pi = in[i++];
    if (j < out.size()) pj = out[j++];
    while (pi != pj) {
      if (pi < pj && i < in.size()) pi *= in[i++];
      else if (j < out.size()) pj *= out[j++];
      else break;
    }
    const int64_t g = static_cast<int64_t>(first_in.size());
    int64_t fi = -1, fo = -1;
    int64_t units = 0;
    for (size_t a = i0; a < i; ++a) {
      group_of_in[a] = g;
      if (fi < 0 && in[a] != 1) fi = static_cast<int64_t>(a);
      if (in[a] == 1) unit_rank_in[a] = units++;
    }
    unit_out.emplace_back();
    for (size_t b = j0; b < j; ++b) {
      if (fo < 0 && out[b] != 1) fo = static_cast<int64_t>(b);
      if (out[b] == 1) unit_out.back().push_back(static_cast<int64_t>(b));
    }
    first_in.push_back(fi);
    first_out.push_back({fo, fo >= 0 ? out[fo] : 1});
  }
  int64_t any_unit_out = -1;
  for (size_t b = 0; b < out.size() && any_unit_out < 0; ++b)
    if (out[b] == 1) any_unit_out = static_cast<int64_t>(b);
  // Pieces tensor dim d is cut into: its shard count, times the blocks of any strided shard that
  // stands alone on it. A flatten / split keeps the layout when every piece is whole and equal.
  auto pieces = [&](int64_t d) {
    int64_t n = x.num_shards(d);
    for (size_t k = 0; k < x.placements.size(); ++k)
      if (shards_dim(x.placements[k], d) && x.placements[k].is_strided_shard() &&
          strided_partners(x.placements, s.mesh.shape(), k).empty())
        n *= x.placements[k].split_factor;
    return n;
  };
  for (int m = 0; m < nd; ++m) {
    if (!in_pl[m].shards()) continue;  // Shard or StridedShard: the same dim maps
    const int64_t d = in_pl[m].dim;
    if (!empty && in[d] == 1) {  // degenerate shard: to a size-1 output dim, or gathered when there is none
      const auto& units = unit_out[group_of_in[d]];
      const int64_t k = unit_rank_in[d];
      const int64_t u = k < static_cast<int64_t>(units.size()) ? units[k] : any_unit_out;
      if (u >= 0) out_pl[m].dim = u;
      else in_pl[m] = out_pl[m] = Replicate();
      continue;
    }
    bool ok = !empty && group_of_in[d] >= 0;
    if (ok) {
      const int64_t g = group_of_in[d];
      const int64_t n = pieces(d);
      const auto [fo, osize] = first_out[g];
      ok = first_in[g] == d && fo >= 0 && (osize == in[d] || (in[d] % n == 0 && osize % n == 0));
      if (ok) out_pl[m].dim = fo;
    }
    if (!ok) {
      DTR_CHECK(!strict || empty || s.mesh.size(m) == 1, "view: cannot view ", x.str(), " as ", out,
                " without communication (tensor dim ", d, " is sharded by mesh dim ", m, "); use reshape");
      in_pl[m] = out_pl[m] = Replicate();
    }
  }
  ShardingDecision dec = same_rank(s, in_pl, out_pl, out);
  dec.rewrite_attrs = true;
  dec.local_attrs = {local_shape_of(s.mesh, out, out_pl)};
  return dec;
}

ShardingDecision rule_view(const OpSchema& s) { return view_rule(s, true); }
ShardingDecision rule_reshape(const OpSchema& s) { return view_rule(s, false); }

DTR_REGISTER_STRIDED_SHARDING_RULE("transpose", rule_transpose);
DTR_REGISTER_STRIDED_SHARDING_RULE("permute", rule_permute);
DTR_REGISTER_SHARDING_RULE("slice", rule_slice);
DTR_REGISTER_SHARDING_RULE("slice_backward", rule_slice_backward);
DTR_REGISTER_SHARDING_RULE("expand", rule_expand);
DTR_REGISTER_STRIDED_SHARDING_RULE("view", rule_view);
DTR_REGISTER_STRIDED_SHARDING_RULE("reshape", rule_reshape);

}  // namespace
}  // namespace dtr::rules
