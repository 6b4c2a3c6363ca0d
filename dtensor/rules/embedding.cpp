// Sharding rules of embedding {ids, weight} and embedding_backward {g, ids[, weight]}, per
// mesh dim (PyTorch's embedding strategies):
//   weight Replicate, ids Shard(i) or Replicate -> output Shard(i) / Replicate (batch);
//   weight Shard(1) (colwise: embedding dim), ids Replicate -> output Shard(last);
//   weight Shard(0) (rowwise / vocab parallel), ids Replicate -> output Partial(sum): each
//   rank looks up only ids in [offset, offset + rows) of its vocab slice and writes zero rows
//   for the others (PyTorch's MaskPartial), so bringing the output to Replicate is one
//   all_reduce. Partial weights are reduced first.
// Backward: embedding_backward receives the weight as an optional third input (for its
// placements only) when the weight is distributed. Vocab-sharded weight: g and ids
// Replicate, each rank scatter-adds the masked ids into its local rows -> Shard(0) gradient;
// colwise: g Shard(last) -> Shard(1); otherwise g Shard(i) with ids Shard(i) -> Partial(sum),
// g Shard(last) -> Shard(1), g Partial(sum) -> Partial(sum) (linear), else Replicate.
// Source: PyTorch torch.distributed.tensor._ops._embedding_ops, Megatron VocabParallelEmbedding.
#include "dtensor/rules/nn_util.h"
#include "tensor/ops.h"

namespace dtr::rules {
namespace {

struct RowRange {
  int64_t offset, rows;
};

RowRange local_rows(const DeviceMesh& mesh, const Shape& wshape, const Placements& wp) {
  Shape ls, off;
  local_shape_and_offset(wshape, mesh.shape(), wp, mesh.get_coordinate(), ls, off);
  return {off[0], ls[0]};
}

/// Local ids shifted into the vocab slice (out-of-slice ids -> 0, int64) and a 0/1 mask of the
/// ids this rank owns, as tensors on the ids' device (tensor ops only; one host read: the range
/// check, as the embedding kernels' own check).
struct MaskedIds {
  Tensor local_ids, mine;  // mine: 0/1 in the ids' dtype, ids' shape
};

MaskedIds mask_ids(const Tensor& ids, RowRange r, int64_t num, const char* op) {
  const Tensor bad = add(to_dtype(lt(ids, 0), DType::f64), to_dtype(gt(ids, static_cast<double>(num - 1)), DType::f64));
  if (ids.numel() > 0 && sum(bad).item<double>() > 0) {
    const std::vector<int64_t> v = ids.to(Device::cpu()).to(DType::i64).to_vector<int64_t>();
    for (size_t i = 0; i < v.size(); ++i)
      DTR_CHECK(v[i] >= 0 && v[i] < num, op, ": id ", v[i], " at local position ", i, " (ids shard of shape ",
                ids.sizes(), ") is out of range for vocab size ", num);
  }
  MaskedIds m;
  m.mine = mul(to_dtype(gt(ids, static_cast<double>(r.offset - 1)), ids.dtype()),
               to_dtype(lt(ids, static_cast<double>(r.offset + r.rows)), ids.dtype()));
  m.local_ids = to_dtype(mul(sub(ids, full_like(ids, static_cast<double>(r.offset))), m.mine), DType::i64);
  return m;
}

/// The 0/1 mask [ids..., 1] in `like`'s dtype, to multiply embedding rows with.
Tensor keep_mask(const MaskedIds& m, const Tensor& like) {
  Shape ms = m.mine.sizes();
  ms.push_back(1);
  return to_dtype(m.mine, like.dtype()).view(ms);
}

ShardingDecision rule_embedding(const OpSchema& s) {
  const DTensorSpec& ids = s.spec(0);
  const DTensorSpec& w = s.spec(1);
  const int nd = s.mesh.ndim();
  const int64_t nid = s.ndim(0);
  Placements ip(nd, Replicate()), wp(nd, Replicate()), op(nd, Replicate());
  bool masked = false;
  for (int m = 0; m < nd; ++m) {
    const Placement& a = w.placements[m];
    const Placement& b = ids.placements[m];
    if (a.is_shard(0)) {
      wp[m] = a;
      op[m] = Partial(ReduceOp::SUM);
      masked = true;
    } else if (a.is_shard(1)) {
      wp[m] = a;
      op[m] = Shard(nid);
    } else if (b.is_shard()) {
      ip[m] = op[m] = b;
    }
  }
  Shape out = ids.shape;
  out.push_back(w.shape[1]);
  ShardingDecision d;
  d.input_placements = {ip, wp};
  d.output_placements = {op};
  d.output_shapes = {out};
  if (masked) {
    const Shape wshape = w.shape;
    d.local_fn = [wp, wshape](const std::vector<Tensor>& in, const OpSchema& sc) {
      const Tensor& ids_l = in[0];
      const Tensor& w_l = in[1];
      const RowRange r = local_rows(sc.mesh, wshape, wp);
      Shape os = ids_l.sizes();
      os.push_back(w_l.sizes()[1]);
      const MaskedIds m = mask_ids(ids_l, r, wshape[0], "embedding");
      if (r.rows == 0) return std::vector<Tensor>{zeros(os, TensorOptions(w_l.dtype()).with_device(w_l.device()))};
      static const OpDef* emb = op_def("embedding");
      Tensor rows = run_kernel(OpCall{emb, {m.local_ids, w_l}, {}}).at(0);
      return std::vector<Tensor>{mul(rows, keep_mask(m, rows))};
    };
  }
  return d;
}

/// inputs {g [..., dim], ids [...], weight (optional, placements only)}, attrs {num}.
ShardingDecision rule_embedding_backward(const OpSchema& s) {
  const DTensorSpec& g = s.spec(0);
  const DTensorSpec* w = s.specs.size() > 2 ? s.specs[2] : nullptr;
  const int nd = s.mesh.ndim();
  const int64_t nid = s.ndim(1), num = s.call.i(0);
  Placements gp(nd, Replicate()), ip(nd, Replicate()), op(nd, Replicate());
  bool masked = false;
  for (int m = 0; m < nd; ++m) {
    const Placement a = w ? w->placements[m] : Replicate();
    const Placement& b = g.placements[m];
    if (a.is_shard(0)) {
      op[m] = Shard(0);
      masked = true;
    } else if (a.is_shard(1) || b.is_shard(nid)) {
      gp[m] = Shard(nid);
      op[m] = Shard(1);
    } else if (b.is_shard()) {
      gp[m] = ip[m] = b;
      op[m] = Partial(ReduceOp::SUM);
    } else if (b.is_partial() && b.reduce == ReduceOp::SUM) {
      gp[m] = op[m] = b;
    }
  }
  ShardingDecision d;
  d.input_placements = {gp, ip, w ? w->placements : Placements{}};
  d.output_placements = {op};
  d.output_shapes = {{num, g.shape.back()}};
  Shape wshape = w ? w->shape : Shape{num, g.shape.back()};
  Placements wp = w ? w->placements : Placements(nd, Replicate());
  // Always a local_fn: the weight input is a placement hint, not a kernel input.
  d.local_fn = [masked, wp, wshape, num](const std::vector<Tensor>& in, const OpSchema& sc) {
    static const OpDef* bw = op_def("embedding_backward");
    const Tensor& g_l = in[0];
    const Tensor& ids_l = in[1];
    if (!masked) return run_kernel(OpCall{bw, {g_l, ids_l}, {num}});
    const RowRange r = local_rows(sc.mesh, wshape, wp);
    const MaskedIds m = mask_ids(ids_l, r, num, "embedding_backward");
    const int64_t dim = g_l.sizes().back();
    if (r.rows == 0) return std::vector<Tensor>{zeros({0, dim}, TensorOptions(g_l.dtype()).with_device(g_l.device()))};
    Tensor gm = mul(g_l, keep_mask(m, g_l));
    return run_kernel(OpCall{bw, {gm, m.local_ids}, {r.rows}});
  };
  return d;
}

DTR_REGISTER_SHARDING_RULE("embedding", rule_embedding);
DTR_REGISTER_SHARDING_RULE("embedding_backward", rule_embedding_backward);

}  // namespace
}  // namespace dtr::rules
