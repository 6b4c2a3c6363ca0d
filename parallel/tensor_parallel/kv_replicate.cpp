// KVReplicateParallel (see kv_replicate.h).
#include "parallel/tensor_parallel/kv_replicate.h"

#include "parallel/tensor_parallel/style_util.h"
#include "tensor/ops.h"

namespace dtr {

KVReplicateParallel::KVReplicateParallel(int64_t kv) : num_kv_heads(kv) {
  input_layout = Replicate();
  desired_input_layout = Replicate();
  use_local_output = true;
}

void KVReplicateParallel::apply(nn::Module& m, const std::string& fqn, const DeviceMesh& mesh, DistributeMemo& memo) {
  tp::check_type(m, fqn, type_name(), {"Linear", "TPLinear", "LoRALinear"});
  const int64_t tp = mesh.size(0), kv = num_kv_heads;
  DTR_CHECK(kv > 0 && tp % kv == 0, fqn, ": KVReplicateParallel needs tp_size (", tp,
            ") to be a multiple of the key/value heads (", kv, ")");
  const int64_t out = m.parameter("weight").size(0);
  DTR_CHECK(out % kv == 0, fqn, ": KVReplicateParallel: out_features ", out, " is not divisible by ", kv,
            " key/value heads");
  for (auto& [sub_fqn, sub] : m.named_modules())
    for (auto& [name, t] : sub->named_parameters("", false)) tp::distribute_param(*sub, name, mesh, {Replicate()}, memo, true);
  tp::install_input_hook(m, mesh, Replicate(), Replicate(), type_name() + " input of '" + fqn + "'");
  const int64_t rep = tp / kv, D = out / kv;
  m.register_forward_hook([kv, rep, D](nn::Module&, const std::vector<Tensor>&,
                                       const std::vector<Tensor>& outs) -> std::optional<std::vector<Tensor>> {
    if (outs.empty() || !outs[0].defined() || !outs[0].is_distributed()) return std::nullopt;
    const Tensor& y = outs[0];  // Replicate [..., kv * D]
    Shape heads = y.sizes();
    heads.back() = kv;
    heads.push_back(1);
    heads.push_back(D);
    Shape rep_shape = heads;
    rep_shape[rep_shape.size() - 2] = rep;
    Shape flat = y.sizes();
    flat.back() = kv * rep * D;
    Tensor r = reshape(expand(view(y, heads), rep_shape), flat);  // [..., tp * D], head r of rank r
    std::vector<Tensor> res = outs;
    res[0] = to_local(redistribute(r, {Shard(static_cast<int64_t>(flat.size()) - 1)}));
    return res;
  });
}

}  // namespace dtr
