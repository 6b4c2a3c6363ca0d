// Expert parallelism (see expert_parallel.h).
#include "parallel/expert_parallel.h"

#include "dtensor/api.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

Tensor index_tensor(const std::vector<int64_t>& v, Device device) {
  Tensor t = from_vector<int64_t>(v, {static_cast<int64_t>(v.size())});
  return device.is_cpu() ? t : t.to(device);
}

int64_t sum_of(const Shape& s) {
  int64_t n = 0;
  for (int64_t v : s) n += v;
  return n;
}

}  // namespace

Tensor all_to_all_single(const Tensor& x, const Shape& out_splits, const Shape& in_splits,
                         const std::shared_ptr<ProcessGroup>& pg) {
  DTR_CHECK(x.dim() >= 1 && !x.is_distributed(), "all_to_all_single: expected a plain tensor with dim >= 1, got ",
            x.sizes());
  Shape shape = x.sizes();
  shape[0] = sum_of(out_splits);
  Tensor out = empty(shape, TensorOptions(x.dtype()).with_device(x.device()));
  {
    NoGradGuard ng;
    Tensor in = x.detach().contiguous();
    pg->all_to_all(out, in, out_splits, in_splits)->wait();
  }
  if (needs_grad({x}))
    record("all_to_all_single", {x}, out, [out_splits, in_splits, pg](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{all_to_all_single(g[0], in_splits, out_splits, pg)};
    });
  return out;
}

AllToAllTokenDispatcher::AllToAllTokenDispatcher(DeviceMesh ep_mesh, int64_t num_experts)
    : mesh_(std::move(ep_mesh)), num_experts_(num_experts) {
  DTR_CHECK(mesh_.ndim() == 1, "AllToAllTokenDispatcher: expected a 1-d ep mesh, got ", mesh_.str());
  pg_ = mesh_.group(0);
  const int64_t P = mesh_.size();
  DTR_CHECK(num_experts % P == 0, "expert parallelism: num_experts=", num_experts, " is not divisible by ep_size=", P);
  local_experts_ = num_experts / P;
}

std::pair<Tensor, Shape> AllToAllTokenDispatcher::dispatch(const Tensor& x, const Shape& counts) {
  const int64_t P = mesh_.size(), El = local_experts_;
  DTR_CHECK(static_cast<int64_t>(counts.size()) == num_experts_, "AllToAllTokenDispatcher: ", counts.size(),
            " counts for ", num_experts_, " experts");
  // Exchange the counts: recv[j * El + l] = rows rank j sends for local expert l.
  Shape recv;
  {
    NoGradGuard ng;
    const Device dev = mesh_.device();
    Tensor c = index_tensor(counts, dev), r = empty({num_experts_}, TensorOptions(DType::i64).with_device(dev));
    pg_->all_to_all(r, c)->wait();
    recv = r.to(Device::cpu()).to_vector<int64_t>();
  }
  in_splits_.assign(P, 0);
  out_splits_.assign(P, 0);
  for (int64_t j = 0; j < P; ++j)
    for (int64_t l = 0; l < El; ++l) {
      in_splits_[j] += counts[j * El + l];
      out_splits_[j] += recv[j * El + l];
    }
  const Tensor xr = all_to_all_single(x, out_splits_, in_splits_, pg_);
  // Received rows are ordered (source rank, local expert); regroup by (local expert, source rank).
  Shape block_start(P * El, 0), local_counts(El, 0);
  for (int64_t q = 0, j = 0; j < P; ++j)
    for (int64_t l = 0; l < El; ++l) {
      block_start[j * El + l] = q;
      q += recv[j * El + l];
      local_counts[l] += recv[j * El + l];
    }
  const int64_t R = sum_of(out_splits_);
  std::vector<int64_t> to_expert(R), to_source(R);
  for (int64_t p = 0, l = 0; l < El; ++l)
    for (int64_t j = 0; j < P; ++j)
      for (int64_t i = 0; i < recv[j * El + l]; ++i, ++p) {
        to_expert[p] = block_start[j * El + l] + i;
        to_source[block_start[j * El + l] + i] = p;
      }
  to_expert_order_ = index_tensor(to_expert, x.device());
  to_source_order_ = index_tensor(to_source, x.device());
  return {embedding(to_expert_order_, xr), local_counts};
}

Tensor AllToAllTokenDispatcher::combine(const Tensor& y) {
  DTR_CHECK(to_source_order_.defined() && y.size(0) == to_source_order_.size(0),
            "AllToAllTokenDispatcher: combine of ", y.sizes(), " does not follow a dispatch of ",
            to_source_order_.defined() ? to_source_order_.size(0) : 0, " rows");
  return all_to_all_single(embedding(to_source_order_, y), in_splits_, out_splits_, pg_);
}

Tensor AllToAllTokenDispatcher::local_experts(const Tensor& w) {
  DTR_CHECK(w.is_distributed(), "AllToAllTokenDispatcher: expert parameter ", w.sizes(),
            " is not sharded over ep (apply_expert_parallel shards it)");
  Tensor l = to_local(w);
  DTR_CHECK(l.size(0) == local_experts_, "AllToAllTokenDispatcher: local experts ", l.sizes(), " (expected ",
            local_experts_, " of ", num_experts_, ")");
  return l;
}

int apply_expert_parallel(nn::Module& model, const DeviceMesh& ep_mesh) {
  DTR_CHECK(ep_mesh.ndim() == 1, "apply_expert_parallel: expected a 1-d ep mesh, got ", ep_mesh.str());
  const int64_t P = ep_mesh.size();
  int n = 0;
  for (auto& [fqn, m] : model.named_modules()) {
    auto moe = std::dynamic_pointer_cast<nn::MoE>(m);
    if (!moe) continue;
    const int64_t E = moe->config().num_experts;
    DTR_CHECK(E % P == 0, "expert parallelism: ", fqn.empty() ? "the MoE block" : fqn, " has num_experts=", E,
              ", not divisible by distributed.ep_size=", P);
    auto experts = moe->experts();
    for (const auto& [name, t] : experts->named_parameters("", /*recurse=*/false)) {  // base + LoRA, all [E, ...]
      DTR_CHECK(!t.is_distributed(), "apply_expert_parallel: ", fqn, ".experts.", name, " is already distributed");
      Tensor d = distribute_tensor(t.detach(), ep_mesh, {Shard(0)});
      d.set_requires_grad(t.requires_grad());
      d.set_name(t.name());
      experts->set_parameter(name, d);
    }
    experts->set_dispatcher(std::make_shared<AllToAllTokenDispatcher>(ep_mesh, E));
    ++n;
  }
  return n;
}

}  // namespace dtr
