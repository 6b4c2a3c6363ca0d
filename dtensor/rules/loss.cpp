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

/// Per local row: lse over the global class dim, and (when `tlogit`) the target's logit.
struct RowStats {
  std::vector<double> x;  // local logits, row-major [n, c]
  std::vector<int64_t> tg;
  std::vector<double> lse, tlogit;
  int64_t n = 0, c = 0, c_off = 0, count = 0;  // count: local non-ignored rows
};

RowStats row_stats(const Tensor& logits, const Tensor& targets, const OpSchema& s, size_t li, const CePlan& p,
                   int64_t ignore, bool want_tlogit, const char* op) {
  RowStats r;
  const int64_t C = s.spec(li).shape[1];
  r.n = logits.sizes()[0];
  r.c = logits.sizes()[1];
  r.c_off = local_offset_of(s.mesh, s.spec(li).shape, p.logits)[1];
  r.x = logits.to_vector<double>();
  r.tg = targets.to_vector<int64_t>();
  for (size_t i = 0; i < r.tg.size(); ++i) {
    if (r.tg[i] == ignore) continue;
    DTR_CHECK(r.tg[i] >= 0 && r.tg[i] < C, op, ": target ", r.tg[i], " at local row ", i, " is out of range [0, ", C,
              ") (ignore_index=", ignore, ")");
    ++r.count;
  }
  const double ninf = -std::numeric_limits<double>::infinity();
  const size_t n1 = static_cast<size_t>(std::max<int64_t>(r.n, 1));  // collectives never get 0 elements
  std::vector<double> mx(n1, ninf);
  for (int64_t i = 0; i < r.n; ++i)
    for (int64_t j = 0; j < r.c; ++j) mx[i] = std::max(mx[i], r.x[i * r.c + j]);
  const TensorOptions f64(DType::f64);
  if (!p.class_dims.empty()) {
    Tensor t = from_vector<double>(mx, {static_cast<int64_t>(n1)}, f64);
    for (int m : p.class_dims) all_reduce_mesh_dim(s.mesh, m, t, ReduceOp::MAX);
    mx = t.to_vector<double>();
  }
  // sums[0, i] = sum exp(x - max), sums[1, i] = target logit (owning rank) or 0.
  std::vector<double> sums(2 * n1, 0.0);
  for (int64_t i = 0; i < r.n; ++i) {
    if (mx[i] != ninf)
      for (int64_t j = 0; j < r.c; ++j) sums[i] += std::exp(r.x[i * r.c + j] - mx[i]);
    const int64_t k = r.tg[i] - r.c_off;
    if (want_tlogit && r.tg[i] != ignore && k >= 0 && k < r.c) sums[n1 + i] = r.x[i * r.c + k];
  }
  if (!p.class_dims.empty()) {
    Tensor t = from_vector<double>(sums, {static_cast<int64_t>(2 * n1)}, f64);
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
    std::vector<double> out(static_cast<size_t>(r.n * r.c), 0.0);
    for (int64_t i = 0; i < r.n; ++i) {
      if (r.tg[i] == ignore) continue;
      for (int64_t j = 0; j < r.c; ++j) out[i * r.c + j] = std::exp(r.x[i * r.c + j] - r.lse[i]) * k;
      const int64_t t = r.tg[i] - r.c_off;
      if (t >= 0 && t < r.c) out[i * r.c + t] -= k;
    }
    return std::vector<Tensor>{
        from_vector<double>(out, in[1].sizes(), TensorOptions(in[1].dtype()).with_device(in[1].device()))};
  };
  return d;
}

DTR_REGISTER_SHARDING_RULE("cross_entropy", rule_cross_entropy);
DTR_REGISTER_SHARDING_RULE("cross_entropy_backward", rule_cross_entropy_backward);

}  // namespace
}  // namespace dtr::rules
