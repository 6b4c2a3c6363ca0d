#pragma once
// clip_grad_norm over plain and distributed gradients. Source: torch.nn.utils.clip_grad_norm_
// (with DTensor gradients: the norm of the full gradients, as torch computes it via
// _NormPartial + full_tensor).
#include <vector>

#include "runtime/process_group.h"
#include "tensor/tensor.h"

namespace dtr {

/// Scales the gradients of `params` in place so that their global norm is at most `max_norm`
/// and returns the total norm before clipping (f64). The norm equals the single-process norm
/// of the full gradients: each rank sums |g|^p over its local shards (f64), the sums are
/// all_reduced (SUM, or MAX for inf) over the mesh dims that shard each gradient, in order;
/// replicated mesh dims and plain tensors are counted once. Gradients on different meshes are
/// grouped by the process groups that shard them. Scale: max_norm / (total + 1e-6) when < 1.
/// Parameters without .grad are skipped. Collective: every rank must pass the same list.
/// Pipeline parallelism: with `pp_group`, each pp rank passes its stages' parameters and the
/// per-rank totals are combined over the group (SUM, or MAX for inf), so the norm covers the
/// whole model; a parameter in `not_counted` (the last stage's copy of a weight tied to the
/// first stage, whose gradient equals the first copy's) is clipped but left out of the norm.
/// Errors: max_norm < 0; norm_type not 2 or inf (or not > 0); a Partial gradient; a non-finite
/// total when error_if_nonfinite.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false, ProcessGroup* pp_group = nullptr,
                      const std::vector<Tensor>& not_counted = {});

}  // namespace dtr
