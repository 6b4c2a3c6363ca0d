// dtr-train's pipelined model (see pipeline_model.h).
#include "apps/train/pipeline_model.h"

#include <algorithm>

#include "dtensor/api.h"
#include "parallel/clip_grad.h"
#include "parallel/pipeline/p2p.h"
#include "parallel/pipeline/parallelize_stage.h"
#include "parallel/pipeline/stage_fsdp.h"
#include "parallel/pipeline/tied_weights.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr::train {
namespace {

double value_of(const Tensor& t) {
  Tensor x = t.detach();
  if (x.is_distributed()) x = full_tensor(x);
  return x.item<double>();
}

}  // namespace

PipelinedModel::PipelinedModel(std::shared_ptr<CausalLM> full, const MeshContext& ctx)
    : full_(std::move(full)), ctx_(ctx) {
  const std::string where = "distributed.pipeline";
  pp_ = ctx.mesh->group("pp");
  pp_rank_ = pp_->rank();
  stages_per_rank_ = ctx.pipeline.stages_per_rank(full_->config().num_hidden_layers, ctx.pp_size, where);
  stages_ = make_pipeline_stages(*full_, static_cast<int>(ctx.pp_size), pp_rank_, stages_per_rank_,
                                 ctx.pipeline.layer_counts, where);
  std::vector<PipelineStage> ps;
  for (size_t i = 0; i < stages_.size(); ++i) {
    parallelize_pipeline_stage(*stages_[i], ctx);
    ps.push_back({stages_[i], static_cast<int>(i * ctx.pp_size) + pp_rank_});
  }
  executor_ = std::make_unique<PipelineExecutor>(ctx.pipeline.schedule, ps,
                                                 static_cast<int>(ctx.pp_size) * stages_per_rank_, pp_);
  for (auto& st : stages_)
    if (!tied_.defined() && (st->is_first() || st->is_last())) tied_ = tied_stage_weight(*st);
  tied_peer_ = stages_.front()->is_first() ? static_cast<int>(ctx.pp_size) - 1 : 0;
}

NamedParams PipelinedModel::trainable() const {
  NamedParams out;
  for (auto& st : stages_)
    for (auto& [n, p] : st->named_parameters())
      if (p.requires_grad() &&
          std::none_of(out.begin(), out.end(), [&](const auto& e) { return e.second.impl() == p.impl(); }))
        out.push_back({n, p});
  return out;
}

double PipelinedModel::step(const std::vector<data::Batch>& mbs, const std::vector<double>& weights) {
  std::vector<Tensor> ids, targets;
  for (const auto& b : mbs) ids.push_back(b.input_ids), targets.push_back(b.labels);
  for (auto& st : stages_) pipeline_unshard(*st);
  // The last stage takes each micro-batch's mean loss through the fused head (lm_head_loss: no
  // [tokens, vocab] logits), as the model without pipelining does (causal_lm_loss).
  std::vector<Tensor> losses = executor_->step(
      ids,
      [&](int k, const Tensor& loss) {
        // No label token (loss 0, gradient 0): the backward still runs (FSDP, TP collectives).
        return mul(loss, mbs[k].num_label_tokens == 0 ? 0.0 : weights[k]);
      },
      targets);
  for (auto& st : stages_) pipeline_reduce_gradients(*st);
  if (tied_.defined()) sum_tied_gradients(*pp_, tied_, tied_peer_);
  double s = 0;
  for (size_t k = 0; k < losses.size(); ++k)
    if (mbs[k].num_label_tokens > 0 && weights[k] != 0)
      s += value_of(losses[k]) / weights[k] * static_cast<double>(mbs[k].num_label_tokens);
  Tensor t = from_vector<double>({s}, {1});
  pp_->all_reduce(t)->wait();  // only the last stage's rank holds losses
  return t.item<double>();
}

double PipelinedModel::clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  std::vector<Tensor> not_counted;
  if (tied_.defined() && !stages_.front()->is_first()) not_counted.push_back(tied_);
  return dtr::clip_grad_norm(params, max_norm, 2.0, false, pp_.get(), not_counted);
}

std::pair<double, double> PipelinedModel::evaluate(const std::vector<data::Batch>& mbs) {
  std::vector<Tensor> ids, targets;
  for (const auto& b : mbs) ids.push_back(b.input_ids), targets.push_back(b.labels);
  for (auto& st : stages_) pipeline_unshard(*st);
  std::vector<Tensor> losses = executor_->forward_only(
      ids, [&](int k, const Tensor& loss) { return mbs[k].num_label_tokens == 0 ? Tensor() : loss; }, targets);
  for (auto& st : stages_) pipeline_reshard(*st);
  double s = 0, n = 0;
  for (size_t k = 0; k < losses.size(); ++k)
    if (losses[k].defined()) {
      s += value_of(losses[k]) * static_cast<double>(mbs[k].num_label_tokens);
      n += static_cast<double>(mbs[k].num_label_tokens);
    }
  Tensor t = from_vector<double>({s, n}, {2});
  pp_->all_reduce(t)->wait();
  auto v = t.to_vector<double>();
  return {v[0], v[1]};
}

void PipelinedModel::gather_to_first_stage_rank() {
  NoGradGuard ng;
  const int P = static_cast<int>(ctx_.pp_size);
  constexpr int kTag = 30001;
  if (pp_rank_ != 0) {
    // Every parameter of this rank's stages, whole, in named_parameters order.
    std::vector<PendingSend> sends;
    for (auto& st : stages_)
      for (auto& [n, p] : st->named_parameters()) {
        Tensor t = p.is_distributed() ? full_tensor(p.detach()) : p.detach();
        sends.push_back(send_tensor(*pp_, t, 0, kTag));
      }
    for (auto& s : sends) s.wait();
    return;
  }
  // pp rank 0: the stages of every other rank, rebuilt from the whole model for their names.
  for (int q = 1; q < P; ++q) {
    auto theirs = make_pipeline_stages(*full_, P, q, stages_per_rank_, ctx_.pipeline.layer_counts,
                                       "distributed.pipeline");
    for (auto& st : theirs)
      for (auto& [n, p] : st->named_parameters()) {
        Tensor t = recv_tensor(*pp_, q, kTag);
        DTR_CHECK(t.sizes() == p.sizes(), "pipeline export: ", n, " came as ", t.sizes(), ", expected ", p.sizes());
        full_->set_parameter(n, t.to(p.dtype()).set_requires_grad(p.requires_grad()));
      }
  }
}

void PipelinedModel::train(bool mode) {
  for (auto& st : stages_) st->train(mode);
}

}  // namespace dtr::train
