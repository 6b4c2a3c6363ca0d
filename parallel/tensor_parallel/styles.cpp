// ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput / Output.
#include "parallel/tensor_parallel/style_util.h"

namespace dtr {

ColwiseParallel::ColwiseParallel(std::optional<Placement> in, std::optional<Placement> out, bool local) {
  input_layout = in.value_or(Replicate());
  desired_input_layout = Replicate();
  output_layout = out.value_or(Shard(-1));
  use_local_output = local;
}

void ColwiseParallel::apply(nn::Module& m, const std::string& fqn, const DeviceMesh& mesh, DistributeMemo& memo) {
  tp::check_type(m, fqn, type_name(), {"Linear", "TPLinear", "Embedding"});
  if (m.type_name() == "Embedding") {
    tp::distribute_param(m, "weight", mesh, {Shard(1)}, memo);
  } else {
    tp::distribute_param(m, "weight", mesh, {Shard(0)}, memo);
    tp::distribute_param(m, "bias", mesh, {Shard(0)}, memo);
  }
  tp::install_input_hook(m, mesh, *input_layout, desired_input_layout, type_name() + " input of '" + fqn + "'");
  tp::install_output_hook(m, output_layout, use_local_output);
}

RowwiseParallel::RowwiseParallel(std::optional<Placement> in, std::optional<Placement> out, bool local) {
  input_layout = in.value_or(Shard(-1));
  output_layout = out.value_or(Replicate());
  use_local_output = local;
}

void RowwiseParallel::apply(nn::Module& m, const std::string& fqn, const DeviceMesh& mesh, DistributeMemo& memo) {
  tp::check_type(m, fqn, type_name(), {"Linear", "TPLinear", "Embedding"});
  if (m.type_name() == "Embedding") {
    tp::distribute_param(m, "weight", mesh, {Shard(0)}, memo);
    // Token ids come replicated; the vocab-parallel lookup gives a Partial output.
    tp::install_input_hook(m, mesh, input_layout.value_or(Replicate()).is_shard() ? Replicate() : *input_layout,
                           Replicate(), type_name() + " input of '" + fqn + "'");
  } else {
    const int64_t in_features = m.parameter("weight").size(1);
    tp::distribute_param(m, "weight", mesh, {Shard(1)}, memo);
    tp::distribute_param(m, "bias", mesh, {Replicate()}, memo);
    tp::install_input_hook(m, mesh, *input_layout, Shard(-1), type_name() + " input of '" + fqn + "'", in_features);
  }
  tp::install_output_hook(m, output_layout, use_local_output);
}

SequenceParallel::SequenceParallel(int64_t seq_dim, bool local) : sequence_dim(seq_dim) {
  input_layout = Shard(seq_dim);
  desired_input_layout = Shard(seq_dim);
  output_layout = Shard(seq_dim);
  use_local_output = local;
}

void SequenceParallel::apply(nn::Module& m, const std::string& fqn, const DeviceMesh& mesh, DistributeMemo& memo) {
  // Parameters (e.g. a norm weight) are replicated; every rank already holds the same values,
  // so they are wrapped without communication. requires_grad is kept (see style.h).
  for (auto& [name, t] : m.named_parameters("", false)) tp::distribute_param(m, name, mesh, {Replicate()}, memo, true);
  tp::install_input_hook(m, mesh, Shard(sequence_dim), Shard(sequence_dim), type_name() + " input of '" + fqn + "'");
  tp::install_output_hook(m, output_layout, use_local_output);
}

PrepareModuleInput::PrepareModuleInput(Placement in, Placement desired, bool local) {
  input_layout = in;
  desired_input_layout = desired;
  use_local_output = local;
}

void PrepareModuleInput::apply(nn::Module& m, const std::string& fqn, const DeviceMesh& mesh, DistributeMemo&) {
  tp::install_input_hook(m, mesh, *input_layout, desired_input_layout, type_name() + " input of '" + fqn + "'");
  if (use_local_output) {
    m.register_forward_pre_hook([](nn::Module&, const std::vector<Tensor>& in) -> std::optional<std::vector<Tensor>> {
      std::vector<Tensor> out = in;
      if (!out.empty() && out[0].defined() && out[0].is_distributed()) out[0] = to_local(out[0]);
      return out;
    });
  }
}

PrepareModuleOutput::PrepareModuleOutput(Placement out, Placement desired, bool local) : desired_output_layout(desired) {
  output_layout = out;
  use_local_output = local;
}

void PrepareModuleOutput::apply(nn::Module& m, const std::string& fqn, const DeviceMesh& mesh, DistributeMemo&) {
  const Placement from = *output_layout, to = desired_output_layout;
  const bool local = use_local_output;
  const std::string where = type_name() + " output of '" + fqn + "'";
  m.register_forward_hook([mesh, from, to, local, where](nn::Module&, const std::vector<Tensor>&,
                                                         const std::vector<Tensor>& outs) -> std::optional<std::vector<Tensor>> {
    if (outs.empty() || !outs[0].defined()) return std::nullopt;
    std::vector<Tensor> r = outs;
    Tensor y = outs[0].is_distributed() ? outs[0] : tp::wrap_local_shard(outs[0], mesh, from, where);
    if (placements(y)[0] != to) y = redistribute(y, {to});
    r[0] = local ? to_local(y) : y;
    return r;
  });
}

}  // namespace dtr
