#include "parallel/tensor_parallel/style_util.h"

#include <algorithm>

#include "tensor/autograd/grad_mode.h"

namespace dtr::tp {

void distribute_param(nn::Module& m, const std::string& name, const DeviceMesh& mesh, const Placements& pl,
                      DistributeMemo& memo, bool local_only) {
  if (!m.has_parameter(name)) return;
  Tensor t = m.parameter(name);
  if (!t.defined() || t.is_distributed()) return;  // never distributed twice
  auto it = memo.done.find(t.impl());
  Tensor d;
  if (it != memo.done.end()) {
    d = it->second;
  } else {
    const bool rg = t.requires_grad();
    {
      NoGradGuard ng;
      d = local_only ? from_local(t.detach(), mesh, pl) : distribute_tensor(t.detach(), mesh, pl, 0);
    }
    if (rg) d.set_requires_grad(true);
    d.set_name(t.name());
    memo.done[t.impl()] = d;
  }
  m.set_parameter(name, d);
}

Tensor wrap_local_shard(const Tensor& x, const DeviceMesh& mesh, Placement pl, const std::string& where,
                        int64_t global_dim) {
  if (!pl.is_shard()) return from_local(x, mesh, {pl});
  DTR_CHECK(x.dim() > 0, where, ": a 0-d input cannot be Shard(", pl.dim, ")");
  const int64_t d = pl.dim < 0 ? pl.dim + x.dim() : pl.dim;
  DTR_CHECK(d >= 0 && d < x.dim(), where, ": Shard(", pl.dim, ") of an input of shape ", x.sizes());
  Shape shape = x.sizes();
  if (global_dim > 0) {
    shape[d] = global_dim;
  } else {
    const int64_t n = mesh.size();
    std::vector<int64_t> sizes(static_cast<size_t>(n), x.size(d));
    if (n > 1) {
      Tensor mine = from_vector<int64_t>({x.size(d)}, {1});
      Tensor all = empty({n}, TensorOptions(DType::i64));
      mesh.group(0)->all_gather(all, mine)->wait();
      sizes = all.to_vector<int64_t>();
    }
    int64_t total = 0;
    for (int64_t v : sizes) total += v;
    for (int64_t r = 0; r < n; ++r) {
      if (sizes[static_cast<size_t>(r)] == chunk_of(total, n, r).size) continue;
      std::vector<int64_t> want;
      for (int64_t k = 0; k < n; ++k) want.push_back(chunk_of(total, n, k).size);
      DTR_ERROR(where, ": the ranks' local sizes of dim ", d, " are ", Shape(sizes), ", not torch.chunk's split of ",
                total, " over ", n, " ranks ", Shape(want));
    }
    shape[d] = total;
  }
  return from_local(x, mesh, {Shard(d)}, false, shape);
}

void install_input_hook(nn::Module& m, const DeviceMesh& mesh, Placement input_layout,
                        std::optional<Placement> desired, const std::string& where, int64_t last_dim) {
  m.register_forward_pre_hook([mesh, input_layout, desired, where, last_dim](nn::Module&, const std::vector<Tensor>& in)
                                  -> std::optional<std::vector<Tensor>> {
    if (in.empty() || !in[0].defined()) return std::nullopt;
    std::vector<Tensor> out = in;
    Tensor x = in[0];
    if (!x.is_distributed()) {
      const bool last = input_layout.is_shard() && x.dim() > 0 &&
                        (input_layout.dim == -1 || input_layout.dim == x.dim() - 1);
      x = wrap_local_shard(x, mesh, input_layout, where, last && last_dim > 0 ? last_dim : -1);
    }
    if (desired && placements(x)[0] != *desired) x = redistribute(x, {*desired});
    out[0] = x;
    return out;
  });
}

void install_output_hook(nn::Module& m, std::optional<Placement> output_layout, bool use_local_output) {
  m.register_forward_hook([output_layout, use_local_output](nn::Module&, const std::vector<Tensor>&,
                                                            const std::vector<Tensor>& outs)
                              -> std::optional<std::vector<Tensor>> {
    if (outs.empty() || !outs[0].defined() || !outs[0].is_distributed()) return std::nullopt;
    std::vector<Tensor> r = outs;
    Tensor y = outs[0];
    // A 0-d output is a loss (nn::Linear's fused {x, targets} head): Replicate, no layout to take.
    if (output_layout && y.dim() > 0 && placements(y)[0] != *output_layout) y = redistribute(y, {*output_layout});
    if (use_local_output) y = to_local(y);
    r[0] = y;
    return r;
  });
}

void check_type(const nn::Module& m, const std::string& fqn, const std::string& style,
                std::initializer_list<const char*> types) {
  const std::string t = m.type_name();
  for (const char* ok : types)
    if (t == ok) return;
  std::string list;
  for (const char* ok : types) list += std::string(list.empty() ? "" : ", ") + ok;
  DTR_ERROR(style, " cannot be applied to module '", fqn, "' of type ", t, " (supported: ", list, ")");
}

}  // namespace dtr::tp
