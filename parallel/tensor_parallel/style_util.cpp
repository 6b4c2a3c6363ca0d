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

void install_input_hook(nn::Module& m, const DeviceMesh& mesh, Placement input_layout,
                        std::optional<Placement> desired, int64_t last_dim) {
  m.register_forward_pre_hook([mesh, input_layout, desired, last_dim](nn::Module&, const std::vector<Tensor>& in)
                                  -> std::optional<std::vector<Tensor>> {
    if (in.empty() || !in[0].defined()) return std::nullopt;
    std::vector<Tensor> out = in;
    Tensor x = in[0];
    if (!x.is_distributed()) {
      std::optional<Shape> shape;
      if (last_dim > 0 && input_layout.is_shard() && x.dim() > 0) {
        shape = x.sizes();
        shape->back() = last_dim;
      }
      x = from_local(x, mesh, {input_layout}, false, shape);
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
    if (output_layout && placements(y)[0] != *output_layout) y = redistribute(y, {*output_layout});
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
