// Sharding rules of sdpa {q, k, v} -> {out, lse} and sdpa_backward {g, q, k, v, out, lse} ->
// {dq, dk, dv}. Attention is independent per (batch, head), so per mesh dim q, k, v (and g,
// out, lse) are all Shard(0) (batch) or all Shard(1) (heads, tensor parallel), taken from the
// first of q, k, v that shards one of those dims; anything else (sequence or head-dim shards,
// Partial) is brought to Replicate (sequence / context parallel attention is not supported).
// Heads: with GQA (Hq != Hkv) both head counts must be divisible by the number of head
// shards so every rank keeps whole query groups; with Hq == Hkv uneven chunks line up.
// lse [B, Hq, T] follows q. Document ids [B, T] / [B, S] (sdpa inputs 3, 4; sdpa_backward 6, 7,
// when the call has a document mask) follow the batch shards and are replicated otherwise. Source: PyTorch torch.distributed.tensor._ops._matrix_ops
// (scaled_dot_product_*_attention strategies).
#include "dtensor/rules/nn_util.h"

namespace dtr::rules {
namespace {

/// Common placements for attention tensors; q, k, v are inputs qi, qi+1, qi+2.
Placements attention_placements(const OpSchema& s, size_t qi) {
  const int nd = s.mesh.ndim();
  Placements pl(nd, Replicate());
  for (int m = 0; m < nd; ++m)
    for (size_t j = qi; j < qi + 3; ++j) {
      const Placement& p = s.spec(j).placements[m];
      if (p.is_shard(0) || p.is_shard(1)) {
        pl[m] = p;
        break;
      }
    }
  int64_t head_shards = 1;
  for (int m = 0; m < nd; ++m)
    if (pl[m].is_shard(1)) head_shards *= s.mesh.size(m);
  const int64_t hq = s.spec(qi).shape[1], hkv = s.spec(qi + 1).shape[1];
  DTR_CHECK(head_shards == 1 || hq == hkv || (hq % head_shards == 0 && hkv % head_shards == 0), s.call.name(),
            ": cannot shard attention heads over ", head_shards, " ranks (mesh ", s.mesh.str(), ", q ",
            placements_str(s.spec(qi).placements), ", k ", placements_str(s.spec(qi + 1).placements),
            "): query heads Hq=", hq, " and key/value heads Hkv=", hkv, " must both be divisible by ", head_shards);
  return pl;
}

/// Placements of the document ids: the batch shards of `pl`, Replicate on the other mesh dims.
Placements document_placements(const Placements& pl) {
  Placements d(pl.size(), Replicate());
  for (size_t m = 0; m < pl.size(); ++m)
    if (pl[m].is_shard(0)) d[m] = pl[m];
  return d;
}

ShardingDecision rule_sdpa(const OpSchema& s) {
  const Placements pl = attention_placements(s, 0);
  const Shape& q = s.spec(0).shape;
  const Shape& v = s.spec(2).shape;
  ShardingDecision d;
  d.input_placements = {pl, pl, pl};
  for (size_t j = 3; j < s.call.inputs.size(); ++j) d.input_placements.push_back(document_placements(pl));
  d.output_placements = {pl, pl};
  d.output_shapes = {{q[0], q[1], q[2], v[3]}, {q[0], q[1], q[2]}};
  return d;
}

ShardingDecision rule_sdpa_backward(const OpSchema& s) {
  const Placements pl = attention_placements(s, 1);
  ShardingDecision d;
  d.input_placements = std::vector<Placements>(6, pl);
  for (size_t j = 6; j < s.call.inputs.size(); ++j) d.input_placements.push_back(document_placements(pl));
  d.output_placements = {pl, pl, pl};
  d.output_shapes = {s.spec(1).shape, s.spec(2).shape, s.spec(3).shape};
  return d;
}

DTR_REGISTER_SHARDING_RULE("sdpa", rule_sdpa);
DTR_REGISTER_SHARDING_RULE("sdpa_backward", rule_sdpa_backward);

}  // namespace
}  // namespace dtr::rules
