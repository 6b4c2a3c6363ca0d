#pragma once
// Helpers for DTensor tests: meshes for the current world size, placement enumerations, and
// the central check "distributed forward and backward equal the single-process result".
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "dtensor/api.h"
#include "gradcheck.h"
#include "runtime/env.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr::testing {

/// f64 tolerance for distributed vs single process: only the summation order differs.
constexpr double kDistTol = 1e-10;

/// The meshes this world size can form: the 1-d world mesh, plus 2 x (world/2) when even and > 2.
inline std::vector<DeviceMesh> test_meshes() {
  std::vector<DeviceMesh> out{DeviceMesh::world("w")};
  const int w = world_size();
  if (w >= 4 && w % 2 == 0) out.push_back(DeviceMesh({2, w / 2}, {"a", "b"}));
  return out;
}

/// All placement lists over `mesh` for a tensor of rank `ndim`, from the single-dim options
/// (Replicate, Shard(d) for every d, Partial(sum) when `partial`, StridedShard(d, d + 2) for
/// every d when `strided`).
inline std::vector<Placements> all_placements(const DeviceMesh& mesh, int64_t ndim, bool partial,
                                              bool strided = false) {
  std::vector<Placement> opts{Replicate()};
  for (int64_t d = 0; d < ndim; ++d) opts.push_back(Shard(d));
  if (partial) opts.push_back(Partial(ReduceOp::SUM));
  if (strided)
    for (int64_t d = 0; d < ndim; ++d) opts.push_back(StridedShard(d, d + 2));
  std::vector<Placements> out{{}};
  for (int i = 0; i < mesh.ndim(); ++i) {
    std::vector<Placements> next;
    for (const auto& p : out)
      for (const auto& o : opts) {
        Placements q = p;
        q.push_back(o);
        next.push_back(q);
      }
    out = next;
  }
  return out;
}

/// A distributed copy of `full` with `pl`; Partial mesh dims hold rank-dependent terms that
/// sum to the full value (so a wrong reduction shows).
inline Tensor make_input(const Tensor& full, const DeviceMesh& mesh, const Placements& pl) {
  Placements no_p = without_partial(pl);
  Tensor d = distribute_tensor(full, mesh, no_p, std::nullopt);
  Tensor local = local_tensor(d);
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (!pl[i].is_partial()) continue;
    const double n = static_cast<double>(mesh.size(i));
    const double r = static_cast<double>(mesh.coordinate(i));
    const double w = (r + 1) / (n * (n + 1) / 2);  // weights sum to 1 over the mesh dim
    local = mul(local, w);
  }
  local = local.contiguous();
  DTensorSpec spec{mesh, normalize_placements(pl, full.dim(), "make_input"), full.sizes(), full.dtype()};
  return make_dtensor(local, spec);
}

/// Runs f on full f64 inputs (single process) and on distributed inputs with `pls`, compares
/// full_tensor of the output and of every input gradient. Returns "" or a failure message.
inline std::string compare_with_single(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                       const std::vector<Tensor>& fulls, const DeviceMesh& mesh,
                                       const std::vector<Placements>& pls, bool backward = true,
                                       double tol = kDistTol) {
  std::vector<Tensor> a;
  for (const auto& t : fulls) a.push_back(t.detach().clone().set_requires_grad(backward && is_floating(t.dtype())));
  Tensor ref = f(a);
  Tensor w;
  if (backward) {
    w = normal(ref.sizes(), 0.0, 1.0, TensorOptions(ref.dtype()));
    sum(mul(ref, w)).backward();
  }
  std::vector<Tensor> b;
  for (size_t i = 0; i < fulls.size(); ++i) {
    Tensor x = make_input(fulls[i], mesh, pls[i]);
    if (backward && is_floating(fulls[i].dtype())) x.set_requires_grad(true);
    b.push_back(x);
  }
  Tensor out = f(b);
  std::string ctx = " [mesh " + mesh.str() + ", placements";
  for (const auto& p : pls) ctx += " " + placements_str(p);
  ctx += "]";
  if (!out.is_distributed()) return "output is not distributed" + ctx;
  Tensor got = full_tensor(out);
  if (got.sizes() != ref.sizes()) return "output shape differs" + ctx;
  if (max_abs_diff(got, ref.detach()) > tol) return "forward differs by " + std::to_string(max_abs_diff(got, ref.detach())) + ctx + " out " + placements_str(placements(out));
  if (!backward) return "";
  Tensor wd = distribute_tensor(w, mesh, without_partial(placements(out)), std::nullopt);
  Tensor loss = sum(mul(out, wd));
  loss.backward();
  for (size_t i = 0; i < fulls.size(); ++i) {
    if (!a[i].requires_grad()) continue;
    if (!b[i].grad().defined()) {
      if (!a[i].grad().defined()) continue;
      return "no gradient for input " + std::to_string(i) + ctx;
    }
    if (placements(b[i].grad()) != without_partial(placements(b[i])))
      return "gradient of input " + std::to_string(i) + " has placements " + placements_str(placements(b[i].grad())) + ctx;
    Tensor g = full_tensor(b[i].grad());
    if (max_abs_diff(g, a[i].grad()) > tol)
      return "gradient of input " + std::to_string(i) + " differs by " + std::to_string(max_abs_diff(g, a[i].grad())) + ctx;
  }
  return "";
}

}  // namespace dtr::testing
