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
#include <algorithm>
#include <cmath>
#include <limits>

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

/// Per local row: lse over the global class dim and (when `want_tlogit`) the target's logit.
/// The O(N * C) work (row max, sum of exp) runs in the op kernels on the local logits
/// (f32 for bf16/f16 inputs); only O(N) vectors are handled here and communicated (in f64).
struct RowStats {
  Tensor x;               // local logits [n, c], contiguous, f32 or f64
  std::vector<int64_t> tg;
  std::vector<double> lse, tlogit;
  int64_t n = 0, c = 0, c_off = 0, count = 0;  // count: local non-ignored rows
};

/// Element (i, j) of a contiguous f32 / f64 matrix with `c` columns.
double at(const Tensor& x, int64_t i, int64_t j, int64_t c) {
  return x.dtype() == DType::f64 ? static_cast<const double*>(x.data_ptr())[i * c + j]
                                 : static_cast<double>(static_cast<const float*>(x.data_ptr())[i * c + j]);
}

RowStats row_stats(const Tensor& logits, const Tensor& targets, const OpSchema& s, size_t li, const CePlan& p,
                   int64_t ignore, bool want_tlogit, const char* op) {
  RowStats r;
  const int64_t C = s.spec(li).shape[1];
  r.x = contiguous(is_low_precision(logits.dtype()) ? to_dtype(logits, DType::f32) : logits);
  r.n = r.x.sizes()[0];
  r.c = r.x.sizes()[1];
  r.c_off = local_offset_of(s.mesh, s.spec(li).shape, p.logits)[1];
  r.tg = targets.to_vector<int64_t>();
  for (size_t i = 0; i < r.tg.size(); ++i) {
    if (r.tg[i] == ignore) continue;
    DTR_CHECK(r.tg[i] >= 0 && r.tg[i] < C, op, ": target ", r.tg[i], " at local row ", i, " is out of range [0, ", C,
              ") (ignore_index=", ignore, ")");
    ++r.count;
  }
  const double ninf = -std::numeric_limits<double>::infinity();
  const int64_t n1 = std::max<int64_t>(r.n, 1);  // collectives never get 0 elements
  const TensorOptions f64(DType::f64);
  // Row max over the global classes.
  std::vector<double> mx(static_cast<size_t>(n1), ninf);
  if (r.n > 0 && r.c > 0) {
    const std::vector<double> lm = amax(r.x, {1}, false).to_vector<double>();
    std::copy(lm.begin(), lm.end(), mx.begin());
  }
  if (!p.class_dims.empty()) {
    Tensor t = from_vector<double>(mx, {n1}, f64);
    for (int m : p.class_dims) all_reduce_mesh_dim(s.mesh, m, t, ReduceOp::MAX);
    mx = t.to_vector<double>();
  }
  // sums[i] = sum_j exp(x_ij - max_i); sums[n1 + i] = target logit (owning rank) or 0.
  std::vector<double> sums(static_cast<size_t>(2 * n1), 0.0);
  if (r.n > 0 && r.c > 0) {
    std::vector<double> shift(mx.begin(), mx.begin() + r.n);
    for (double& v : shift)
      if (v == ninf) v = 0;  // a row of -inf logits: exp(-inf) = 0, lse stays -inf below
    const Tensor m = from_vector<double>(shift, {r.n, 1}, TensorOptions(r.x.dtype()));
    const std::vector<double> e = sum(exp(sub(r.x, m)), {1}, false).to_vector<double>();
    std::copy(e.begin(), e.end(), sums.begin());
  }
  for (int64_t i = 0; i < r.n; ++i) {
    const int64_t k = r.tg[i] - r.c_off;
    if (want_tlogit && r.tg[i] != ignore && k >= 0 && k < r.c) sums[n1 + i] = at(r.x, i, k, r.c);
  }
  if (!p.class_dims.empty()) {
    Tensor t = from_vector<double>(sums, {2 * n1}, f64);
    for (int m : p.class_dims) all_reduce_mesh_dim(s.mesh, m, t, ReduceOp::SUM);
    sums = t.to_vector<double>();
  }
  r.lse.resize(r.n);
  r.tlogit.resize(r.n);
  for (int64_t i = 0; i < r.n; ++i) {
    r.lse[i] = mx[i] == ninf ? ninf : mx[i] + std::log(sums[i]);
    r.tlogit[i] = sums[n1 + i];
  }
  return r;
}

ShardingDecision rule_cross_entropy(const OpSchema& s) {
  const CePlan p = plan(s, 0);
  ShardingDecision d;
  d.input_placements = {p.logits, p.targets};
  d.output_placements = {replicate_all(s.mesh.ndim())};
  d.output_shapes = {Shape{}};
  if (p.row_dims.empty() && p.class_dims.empty()) return d;
  d.local_fn = [p](const std::vector<Tensor>& in, const OpSchema& sc) {
    const int64_t ignore = sc.call.i(0);
    const RowStats r = row_stats(in[0], in[1], sc, 0, p, ignore, true, "cross_entropy");
    double total = 0;
    for (int64_t i = 0; i < r.n; ++i)
      if (r.tg[i] != ignore) total += r.lse[i] - r.tlogit[i];
    std::vector<double> tc{total, static_cast<double>(r.count)};
    if (!p.row_dims.empty()) {
      Tensor t = from_vector<double>(tc, {2}, TensorOptions(DType::f64));
      for (int m : p.row_dims) all_reduce_mesh_dim(sc.mesh, m, t, ReduceOp::SUM);
      tc = t.to_vector<double>();
    }
    const double loss = tc[1] == 0 ? 0.0 : tc[0] / tc[1];
    return std::vector<Tensor>{
        from_vector<double>({loss}, {}, TensorOptions(in[0].dtype()).with_device(in[0].device()))};
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
    const int64_t ignore = sc.call.i(0);
    const double g = in[0].item<double>();
    const RowStats r = row_stats(in[1], in[2], sc, 1, p, ignore, false, "cross_entropy_backward");
    double count = static_cast<double>(r.count);
    if (!p.row_dims.empty()) {
      Tensor t = from_vector<double>({count}, {1}, TensorOptions(DType::f64));
      for (int m : p.row_dims) all_reduce_mesh_dim(sc.mesh, m, t, ReduceOp::SUM);
      count = t.item<double>();
    }
    const double k = count == 0 ? 0.0 : g / count;
    // dlogits = exp(x - lse) * k on non-ignored rows (0 elsewhere), minus k at the owned target.
    std::vector<double> lse(r.lse), kcol(static_cast<size_t>(r.n), 0.0);
    for (int64_t i = 0; i < r.n; ++i) {
      if (r.tg[i] != ignore) kcol[i] = k;
      else lse[i] = 0;
    }
    const TensorOptions xo(r.x.dtype());
    Tensor out = contiguous(
        mul(exp(sub(r.x, from_vector<double>(lse, {r.n, 1}, xo))), from_vector<double>(kcol, {r.n, 1}, xo)));
    for (int64_t i = 0; i < r.n; ++i) {
      const int64_t t = r.tg[i] - r.c_off;
      if (r.tg[i] == ignore || t < 0 || t >= r.c) continue;
      if (out.dtype() == DType::f64) static_cast<double*>(out.data_ptr())[i * r.c + t] -= k;
      else static_cast<float*>(out.data_ptr())[i * r.c + t] -= static_cast<float>(k);
    }
    return std::vector<Tensor>{to_dtype(out, in[1].dtype())};
  };
  return d;
}

DTR_REGISTER_SHARDING_RULE("cross_entropy", rule_cross_entropy);
DTR_REGISTER_SHARDING_RULE("cross_entropy_backward", rule_cross_entropy_backward);

}  // namespace
}  // namespace dtr::rules
