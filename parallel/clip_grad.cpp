// clip_grad_norm (see clip_grad.h).
#include "parallel/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dtensor/api.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite,
                      ProcessGroup* pp_group, const std::vector<Tensor>& not_counted) {
  DTR_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  const bool inf = std::isinf(norm_type);
  DTR_CHECK(inf || norm_type > 0, "clip_grad_norm: norm_type must be > 0 or inf, got ", norm_type);
  NoGradGuard no_grad;
  // Partial results per set of sharding groups, in first-appearance order (same on all ranks),
  // as f64 [1] tensors on the gradients' device: one host read for the returned norm.
  struct Part {
    std::vector<ProcessGroup*> groups;
    Tensor value;
  };
  std::vector<Part> parts;
  std::vector<Tensor> locals;
  for (const Tensor& p : params) {
    if (!p.defined()) continue;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    std::vector<ProcessGroup*> groups;
    Tensor local = g;
    if (g.is_distributed()) {
      const DTensorSpec& s = dtensor_spec(g, "clip_grad_norm");
      DTR_CHECK(!s.has_partial(), "clip_grad_norm: gradient ", s.str(), " is Partial; reduce it first");
      for (int i = 0; i < s.mesh.ndim(); ++i)
        if (s.placements[i].shards() && s.mesh.size(i) > 1) groups.push_back(s.mesh.group(i).get());
      local = local_tensor(g);
    }
    locals.push_back(local);
    if (std::any_of(not_counted.begin(), not_counted.end(), [&](const Tensor& t) { return t.impl() == p.impl(); }))
      continue;
    Tensor v = zeros({1}, TensorOptions(DType::f64).with_device(local.device()));
    if (local.numel() > 0) {
      const Tensor a = abs(local.to(DType::f64));
      v = (inf ? amax(a) : sum(norm_type == 2.0 ? mul(a, a) : pow(a, norm_type))).view({1});
    }
    auto it = std::find_if(parts.begin(), parts.end(), [&](const Part& q) { return q.groups == groups; });
    if (it == parts.end()) {
      parts.push_back({groups, v});
      continue;
    }
    it->value = inf ? maximum(it->value, v) : add(it->value, v);
  }
  Tensor norm;  // the norm of order norm_type to that power (max for inf), f64 [1]
  for (Part& part : parts) {
    for (ProcessGroup* pg : part.groups) pg->all_reduce(part.value, inf ? ReduceOp::MAX : ReduceOp::SUM)->wait();
    norm = !norm.defined() ? part.value : inf ? maximum(norm, part.value) : add(norm, part.value);
  }
  if (pp_group != nullptr && pp_group->size() > 1) {  // every pp rank joins, with or without gradients
    if (!norm.defined()) norm = zeros({1}, TensorOptions(DType::f64));
    pp_group->all_reduce(norm, inf ? ReduceOp::MAX : ReduceOp::SUM)->wait();
  }
  double total = norm.defined() ? norm.item<double>() : 0.0;
  if (!inf) total = std::pow(total, 1.0 / norm_type);
  DTR_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm: the total norm of order ", norm_type,
            " is non-finite (", total, ")");
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0)
    for (Tensor& l : locals) mul_(l, coef);
  return total;
}

}  // namespace dtr
