#include "dtensor/api.h"

#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace dtr {

Tensor distribute_tensor(const Tensor& t, const DeviceMesh& mesh, const Placements& placements,
                         std::optional<int> src_data_rank) {
  DTR_CHECK(!t.is_distributed(), "distribute_tensor: input is already distributed (", t.dist_spec()->str(), ")");
  DTR_CHECK(static_cast<int>(placements.size()) == mesh.ndim(), "distribute_tensor: ", placements.size(),
            " placements ", placements_str(placements), " for a ", mesh.ndim(), "-d mesh ", mesh.str());
  const Placements p = normalize_placements(placements, t.dim(), "distribute_tensor");
  if (is_meta(t)) {
    // Meta initialisation: the local shard stays meta (its block of the recipe); nothing is
    // broadcast, nothing allocated. Whoever gives it memory (fully_shard, materialize) fills it.
    DTensorSpec out{mesh, p, t.sizes(), t.dtype()};
    for (const Placement& pl : p)
      DTR_CHECK(!pl.is_strided_shard() && !pl.is_partial(), "distribute_tensor: a meta tensor placed ",
                placements_str(p), " (strided shards and Partial of meta tensors are not built; materialise it first)");
    Tensor d = make_dtensor(meta_block(t, out.local_offset(), out.local_shape()), out);
    if (t.requires_grad() && t.is_leaf()) d.set_requires_grad(true);
    return d;
  }
  Tensor full = t.detach().contiguous();
  if (src_data_rank) {
    NoGradGuard ng;
    full = full.clone();
    // Broadcast from the mesh rank `src_data_rank` along every mesh dim in turn.
    std::vector<int64_t> src(mesh.ndim());
    int64_t r = *src_data_rank;
    for (int i = mesh.ndim() - 1; i >= 0; --i) {
      src[i] = r % mesh.size(i);
      r /= mesh.size(i);
    }
    for (int i = mesh.ndim() - 1; i >= 0; --i) mesh.group(i)->broadcast(full, static_cast<int>(src[i]))->wait();
  }
  DTensorSpec rep{mesh, replicate_all(mesh.ndim()), t.sizes(), t.dtype()};
  DTensorSpec out{mesh, p, t.sizes(), t.dtype()};
  Tensor local = redistribute_local(full, rep, p);
  if (local.is_same(full) || local.storage() == t.storage()) local = local.clone();
  Tensor d = make_dtensor(local, out);
  if (t.requires_grad() && t.is_leaf()) d.set_requires_grad(true);
  return d;
}

Tensor from_local(const Tensor& local, const DeviceMesh& mesh, const Placements& placements, bool run_check,
                  std::optional<Shape> shape) {
  DTR_CHECK(!local.is_distributed(), "from_local: the local tensor is already distributed");
  DTR_CHECK(static_cast<int>(placements.size()) == mesh.ndim(), "from_local: ", placements.size(), " placements ",
            placements_str(placements), " for a ", mesh.ndim(), "-d mesh ", mesh.str());
  const Placements p = normalize_placements(placements, local.dim(), "from_local");
  Shape global = local.sizes();
  if (shape) {
    global = *shape;
  } else if (run_check) {
    // Exact global sizes: sum local sizes over each shard mesh dim (innermost first).
    for (int i = mesh.ndim() - 1; i >= 0; --i) {
      if (!p[i].is_shard()) continue;
      const int64_t d = p[i].dim;
      Tensor sz = from_vector<int64_t>({global[d]}, {1});
      mesh.group(i)->all_reduce(sz, ReduceOp::SUM)->wait();
      global[d] = sz.item<int64_t>();
    }
  } else {
    for (int i = 0; i < mesh.ndim(); ++i)
      if (p[i].is_shard()) global[p[i].dim] *= mesh.size(i);
  }
  if (run_check) {
    // Every rank must agree on rank, dtype and the global shape.
    std::vector<int64_t> mine{static_cast<int64_t>(global.size()), static_cast<int64_t>(local.dtype())};
    mine.insert(mine.end(), global.begin(), global.end());
    Tensor a = from_vector<int64_t>(mine, {static_cast<int64_t>(mine.size())});
    Tensor mx = a.clone(), mn = a.clone();
    for (int i = 0; i < mesh.ndim(); ++i) {
      mesh.group(i)->all_reduce(mx, ReduceOp::MAX)->wait();
      mesh.group(i)->all_reduce(mn, ReduceOp::MIN)->wait();
    }
    DTR_CHECK(mx.to_vector<int64_t>() == mn.to_vector<int64_t>(), "from_local(run_check): ranks disagree on the ",
              "global shape or dtype (this rank: local ", local.sizes(), " ", local.dtype(), ", global ", global, ")");
  }
  DTensorSpec spec{mesh, p, global, local.dtype()};
  Tensor out = make_dtensor(local.detach(), spec);
  if (needs_grad({local})) {
    Placements back = without_partial(p);
    record("from_local", {local}, out, [back](const std::vector<Tensor>& g, const std::vector<bool>&) {
      Tensor gg = g[0];
      if (gg.is_distributed()) {
        if (dtensor_spec(gg).placements != back) gg = redistribute(gg, back);
        return std::vector<Tensor>{local_tensor(gg)};
      }
      return std::vector<Tensor>{gg};
    });
  }
  return out;
}

void set_grad_keeps_partial(const Tensor& leaf, bool keep) {
  dtensor_spec(leaf, "set_grad_keeps_partial");
  static_cast<DTensorState*>(leaf.dist_spec().get())->grad_keeps_partial = keep;
}

Tensor to_local(const Tensor& x) {
  const DTensorSpec& s = dtensor_spec(x, "to_local");
  Tensor out = local_tensor(x).detach();
  if (needs_grad({x})) {
    record("to_local", {x}, out, [spec = s](const std::vector<Tensor>& g, const std::vector<bool>&) {
      DTensorSpec gs = spec;
      gs.dtype = g[0].dtype();
      return std::vector<Tensor>{make_dtensor(g[0], gs)};
    });
  }
  return out;
}

Tensor full_tensor(const Tensor& x) {
  const DTensorSpec& s = dtensor_spec(x, "full_tensor");
  return to_local(redistribute(x, replicate_all(s.mesh.ndim())));
}

const Placements& placements(const Tensor& x) { return dtensor_spec(x, "placements").placements; }
const DeviceMesh& device_mesh(const Tensor& x) { return dtensor_spec(x, "device_mesh").mesh; }

}  // namespace dtr
