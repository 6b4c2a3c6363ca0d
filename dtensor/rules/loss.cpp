// Sharding rules of cross_entropy {logits [N, C], targets [N]} -> mean loss (0-d) and
// cross_entropy_backward {g (0-d), logits, targets} -> dlogits. Per mesh dim:
//   logits Shard(0) (rows) with targets Shard(0): each rank sums its rows' losses and counts
//   its non-ignored targets; one all_reduce of (sum, count) gives the exact global mean
//   (uneven and ignore-heavy shards included);
//   logits Shard(1) (classes, loss parallel), targets Replicate: the logits are never gathered:
//   row max -> all_reduce MAX, sum of exp and the target logit (picked by the rank owning the
//   class, 0 elsewhere) -> one all_reduce SUM;
//   otherwise logits and targets Replicate (Partial logits are reduced first).
// The loss is Replicate. Backward: the same statistics (lse per row: MAX then SUM over class
// shards; global count: SUM over row shards), then locally softmax slice minus one-hot on the
// owning rank, times g / count; the gradient keeps the logits' placements.
// Source: PyTorch torch.distributed.tensor.parallel.loss_parallel, Megatron
// vocab_parallel_cross_entropy.
#include <cmath>

#include "dtensor/rules/nn_util.h"
#include "tensor/ops.h"

namespace dtr::rules {
namespace {

struct CePlan {
  Placements logits, targets;
  std::vector<int> row_dims, class_dims;
};

CePlan plan(const OpSchema& s, size_t li) {
  const DTensorSpec& L = s.spec(li);
  const DTensorSpec& t = s.spec(li + 1);
  const int nd = s.mesh.ndim();
  CePlan p{Placements(nd, Replicate()), Placements(nd, Replicate()), {}, {}};
  for (int m = 0; m < nd; ++m) {
    const Placement& a = L.placements[m];
    if (a.is_shard(0) || (!a.shards() && !a.is_partial() && t.placements[m].is_shard(0))) {
      p.logits[m] = p.targets[m] = Shard(0);
      if (s.mesh.size(m) > 1) p.row_dims.push_back(m);  // a 1-rank mesh dim needs no reduction
    } else if (a.is_shard(1)) {
      p.logits[m] = Shard(1);
      if (s.mesh.size(m) > 1) p.class_dims.push_back(m);
    }
  }
  return p;
}

/// Per local row: lse over the global class dim and the target's logit (picked on the rank
/// owning the class, 0 elsewhere). Everything is a tensor op on the local shards' device: the
/// O(N * C) work (row max, sum of exp, the target pick) on the local logits (f32 for bf16/f16
/// inputs), the O(N) statistics in f64 and communicated as tensors. One host read: the target
/// range check (as the local cross_entropy kernels' check).
struct RowStats {
  Tensor x;        // local logits [n, c], f32 or f64
  Tensor ignored;  // [n] bool: target == ignore_index
  Tensor valid;    // [n] f64: 1 for counted rows, 0 for ignored ones
  Tensor target;   // [n, c] bool (backward only): the target's one-hot on its owning rank, valid rows
  Tensor lse;      // [n] f64
  Tensor count;    // [1] f64: local non-ignored rows
  Tensor tlogit;   // [n] f64: the target logit (summed over class shards)
  int64_t n = 0, c = 0;
};

/// `t` when it has elements, else a [1] tensor of `fill` (collectives never get 0 elements).
Tensor nonempty(const Tensor& t, double fill) {
  return t.numel() > 0 ? t : full({1}, fill, TensorOptions(t.dtype()).with_device(t.device()));
}

RowStats row_stats(const Tensor& logits, const Tensor& targets, const OpSchema& s, size_t li, const CePlan& p,
                   int64_t ignore, bool want_target, const char* op) {
  RowStats r;
  const int64_t C = s.spec(li).shape[1];
  const Device dev = logits.device();
  r.x = is_low_precision(logits.dtype()) ? to_dtype(logits, DType::f32) : logits;
  r.n = r.x.sizes()[0];
  r.c = r.x.sizes()[1];
  const int64_t c_off = local_offset_of(s.mesh, s.spec(li).shape, p.logits)[1];
  const TensorOptions f64 = TensorOptions(DType::f64).with_device(dev);
  r.ignored = eq(targets, full_like(targets, static_cast<double>(ignore)));
  r.valid = rsub(to_dtype(r.ignored, DType::f64), 1.0);
  const Tensor bad = mul(r.valid, add(to_dtype(lt(targets, 0), DType::f64), to_dtype(gt(targets, C - 1), DType::f64)));
  if (r.n > 0 && sum(bad).item<double>() > 0) {
    const std::vector<int64_t> tg = targets.to(Device::cpu()).to_vector<int64_t>();
    for (size_t i = 0; i < tg.size(); ++i)
      DTR_CHECK(tg[i] == ignore || (tg[i] >= 0 && tg[i] < C), op, ": target ", tg[i], " at local row ", i,
                " is out of range [0, ", C, ") (ignore_index=", ignore, ")");
  }
  r.count = sum(r.valid).view({1});
  // Row max over the global classes (exact in the logits' dtype, then f64).
  Tensor mx = r.c > 0 ? amax(r.x, {1}, false) : full({r.n}, -INFINITY, TensorOptions(r.x.dtype()).with_device(dev));
  if (!p.class_dims.empty()) {
    Tensor t = nonempty(to_dtype(mx, DType::f64), -INFINITY);
    for (int m : p.class_dims) all_reduce_mesh_dim(s.mesh, m, t, ReduceOp::MAX);
    mx = t.narrow(0, 0, r.n);
  }
  mx = to_dtype(mx, DType::f64);
  // A row of -inf logits: shift by 0 (exp(-inf) = 0), its lse stays -inf.
  const Tensor shift = masked_fill(mx, eq(mx, full_like(mx, -INFINITY)), 0.0);
  // sum_j exp(x_ij - shift_i) and the target logit, [2n] f64, summed over class shards.
  Tensor e = zeros({r.n}, f64), tlogit = zeros({r.n}, f64);
  // Ignored rows get target -1, which no class index matches.
  const Tensor counted = where(r.ignored, full_like(targets, -1.0), targets);
  if (want_target) {
    const Tensor cls = arange(static_cast<double>(c_off), static_cast<double>(c_off + r.c), 1.0,
                              TensorOptions(targets.dtype()).with_device(dev));
    r.target = eq(cls.view({1, r.c}).expand({r.n, r.c}), counted.view({r.n, 1}).expand({r.n, r.c}));
  }
  if (r.n > 0 && r.c > 0) {
    e = to_dtype(sum(exp(sub(r.x, to_dtype(shift, r.x.dtype()).view({r.n, 1}))), {1}, false), DType::f64);
    // The target logit: a row gather x[i, t_i - c_off] of the rows whose target this rank owns
    // (an embedding lookup into x viewed as [n * c, 1]; O(n) memory, no [n, c] mask).
    const Tensor owned_f = mul(to_dtype(gt(counted, static_cast<double>(c_off - 1)), DType::f64),
                               to_dtype(lt(counted, static_cast<double>(c_off + r.c)), DType::f64));
    const Tensor local_k = mul(sub(counted, full_like(counted, static_cast<double>(c_off))), to_dtype(owned_f, counted.dtype()));
    const Tensor row0 = arange(0, static_cast<double>(r.n * r.c), static_cast<double>(r.c),
                               TensorOptions(counted.dtype()).with_device(dev));
    const Tensor picked = embedding(to_dtype(add(row0, local_k), DType::i64), r.x.reshape({r.n * r.c, 1})).view({r.n});
    tlogit = where(gt(owned_f, 0.5), to_dtype(picked, DType::f64), zeros({}, f64));
  }
  if (!p.class_dims.empty()) {
    Tensor t = nonempty(cat({e, tlogit}, 0), 0.0);
    for (int m : p.class_dims) all_reduce_mesh_dim(s.mesh, m, t, ReduceOp::SUM);
    e = t.narrow(0, 0, r.n);
    tlogit = t.narrow(0, r.n, r.n);
  }
  r.lse = add(mx, log(e));
  r.tlogit = tlogit;
  return r;
}

/// SUM over the row-sharded mesh dims of `t` (in place, returned).
Tensor sum_over_rows(Tensor t, const OpSchema& sc, const CePlan& p) {
  for (int m : p.row_dims) all_reduce_mesh_dim(sc.mesh, m, t, ReduceOp::SUM);
  return t;
}

ShardingDecision rule_cross_entropy(const OpSchema& s) {
  const CePlan p = plan(s, 0);
  ShardingDecision d;
  d.input_placements = {p.logits, p.targets};
  d.output_placements = {replicate_all(s.mesh.ndim())};
  d.output_shapes = {Shape{}};
  if (p.row_dims.empty() && p.class_dims.empty()) return d;
  d.local_fn = [p](const std::vector<Tensor>& in, const OpSchema& sc) {
    const RowStats r = row_stats(in[0], in[1], sc, 0, p, sc.call.i(0), false, "cross_entropy");
    const Tensor zero = zeros({}, TensorOptions(DType::f64).with_device(r.lse.device()));
    // (sum of lse - target logit over counted rows, count), summed over row shards.
    const Tensor total = sum(where(r.ignored, zero, sub(r.lse, r.tlogit))).view({1});
    const Tensor tc = sum_over_rows(cat({total, r.count}, 0), sc, p);
    // count 0: total is 0 as well, so the loss is 0.
    const Tensor cnt = tc.narrow(0, 1, 1);
    const Tensor loss = div(tc.narrow(0, 0, 1), maximum(cnt, full_like(cnt, 1.0))).view({});
    return std::vector<Tensor>{to_dtype(loss, in[0].dtype())};
  };
  return d;
}

ShardingDecision rule_cross_entropy_backward(const OpSchema& s) {
  const CePlan p = plan(s, 1);
  ShardingDecision d;
  d.input_placements = {replicate_all(s.mesh.ndim()), p.logits, p.targets};
  d.output_placements = {p.logits};
  d.output_shapes = {s.spec(1).shape};
  if (p.row_dims.empty() && p.class_dims.empty()) return d;
  d.local_fn = [p](const std::vector<Tensor>& in, const OpSchema& sc) {
    const RowStats r = row_stats(in[1], in[2], sc, 1, p, sc.call.i(0), true, "cross_entropy_backward");
    const Tensor count = sum_over_rows(r.count, sc, p);
    // k = g / count (count 0: every row is ignored and every k below is multiplied by 0).
    const Tensor k = div(to_dtype(in[0], DType::f64).view({1}), maximum(count, full_like(count, 1.0)));
    // dlogits = exp(x - lse) * k on counted rows (0 on ignored ones), minus k at the owned target.
    const DType xd = r.x.dtype();
    const Tensor zero = zeros({}, TensorOptions(DType::f64).with_device(r.lse.device()));
    const Tensor lse = to_dtype(where(r.ignored, zero, r.lse), xd).view({r.n, 1});
    const Tensor kcol = to_dtype(mul(r.valid, k), xd).view({r.n, 1});
    const Tensor kx = to_dtype(k, xd).view({1, 1});
    const Tensor zero_x = zeros({}, TensorOptions(xd).with_device(r.x.device()));
    const Tensor out = sub(mul(exp(sub(r.x, lse)), kcol), where(r.target, kx, zero_x));
    return std::vector<Tensor>{to_dtype(out, in[1].dtype())};
  };
  return d;
}

DTR_REGISTER_SHARDING_RULE("cross_entropy", rule_cross_entropy);
DTR_REGISTER_SHARDING_RULE("cross_entropy_backward", rule_cross_entropy_backward);

}  // namespace
}  // namespace dtr::rules
