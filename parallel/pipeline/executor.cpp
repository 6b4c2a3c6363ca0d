// Runs a pipeline schedule (see executor.h).
#include "parallel/pipeline/executor.h"

#include <chrono>
#include <tuple>

#include "parallel/pipeline/p2p.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// One tag per (direction, receiving stage): the micro-batches of a stage travel in order.
int tag_of(bool grad, int stage, int num_stages) { return (grad ? num_stages : 0) + stage; }

}  // namespace

PipelineExecutor::PipelineExecutor(PipelineScheduleKind kind, std::vector<PipelineStage> stages, int num_stages,
                                   std::shared_ptr<ProcessGroup> pp_group)
    : kind_(kind), stages_(std::move(stages)), num_stages_(num_stages), pg_(std::move(pp_group)) {
  DTR_CHECK(pg_ != nullptr, "PipelineExecutor: no pp group");
  const int pp = pg_->size(), r = pg_->rank();
  DTR_CHECK(num_stages_ % pp == 0 && static_cast<int>(stages_.size()) == num_stages_ / pp, "PipelineExecutor: ",
            num_stages_, " stages over pp ", pp, " need ", num_stages_ / pp, " stages per rank, this rank holds ",
            stages_.size());
  for (size_t i = 0; i < stages_.size(); ++i) {
    DTR_CHECK(stages_[i].module != nullptr, "PipelineExecutor: stage ", stages_[i].stage_index, " has no module");
    DTR_CHECK(stages_[i].stage_index == static_cast<int>(i) * pp + r, "PipelineExecutor: pp rank ", r,
              " must hold stages ", r, ", ", r + pp, ", ... in order; got stage ", stages_[i].stage_index,
              " at position ", i);
  }
  if (kind_ != PipelineScheduleKind::Interleaved1F1B)
    DTR_CHECK(stages_.size() == 1, "PipelineExecutor: ", pipeline_schedule_name(kind_), " runs one stage per rank, got ",
              stages_.size(), " (use interleaved1f1b for virtual stages)");
}

std::vector<Tensor> PipelineExecutor::step(const std::vector<Tensor>& inputs, const LossFn& loss_fn,
                                           const std::vector<Tensor>& targets) {
  const int m = static_cast<int>(inputs.size());
  DTR_CHECK(m >= 1, "PipelineExecutor::step: no micro-batches");
  PipelineShape shape{pg_->size(), static_cast<int>(stages_.size()), m};
  return run(pipeline_schedule(kind_, shape, pg_->rank()), inputs, targets, loss_fn, true);
}

std::vector<Tensor> PipelineExecutor::forward_only(const std::vector<Tensor>& inputs, const LossFn& loss_fn,
                                                   const std::vector<Tensor>& targets) {
  const int m = static_cast<int>(inputs.size());
  DTR_CHECK(m >= 1, "PipelineExecutor::forward_only: no micro-batches");
  std::vector<PipelineAction> actions;
  for (int mb = 0; mb < m; ++mb)
    for (const auto& st : stages_) actions.push_back({PipelineAction::Forward, st.stage_index, mb});
  NoGradGuard no_grad;
  return run(actions, inputs, targets, loss_fn, false);
}

std::vector<Tensor> PipelineExecutor::run(const std::vector<PipelineAction>& actions, const std::vector<Tensor>& inputs,
                                          const std::vector<Tensor>& targets, const LossFn& loss_fn, bool with_grad) {
  const auto t_step = Clock::now();
  const int pp = pg_->size(), S = num_stages_, m = static_cast<int>(inputs.size());
  DTR_CHECK(targets.empty() || static_cast<int>(targets.size()) == m, "PipelineExecutor: ", targets.size(),
            " targets for ", m, " micro-batches (give one per micro-batch, or none)");
  stats_ = PipelineStepStats{};

  // Per (stage, micro-batch): the stage input leaf, and its output (the loss on the last stage).
  std::map<std::pair<int, int>, std::pair<Tensor, Tensor>> live;
  // Transfers between two stages of this rank (pp 1) skip the group.
  std::map<std::tuple<bool, int, int>, Tensor> local;
  std::vector<PendingSend> sends;
  std::vector<Tensor> losses(m);

  auto transfer = [&](bool grad, int to_stage, int mb, const Tensor& t) {
    const int dst = to_stage % pp;
    if (dst == pg_->rank()) local[{grad, to_stage, mb}] = t.detach();
    else sends.push_back(send_tensor(*pg_, t, dst, tag_of(grad, to_stage, S)));
  };
  auto receive = [&](bool grad, int stage, int from_stage, int mb) {
    auto it = local.find({grad, stage, mb});
    if (it != local.end()) {
      Tensor t = it->second;
      local.erase(it);
      return t;
    }
    const auto t0 = Clock::now();
    Tensor t = recv_tensor(*pg_, from_stage % pp, tag_of(grad, stage, S));
    stats_.wait_s += since(t0);
    return t;
  };

  for (const PipelineAction& a : actions) {
    nn::Module& mod = *stages_[a.stage / pp].module;
    DTR_CHECK(a.microbatch < m, "PipelineExecutor: micro-batch ", a.microbatch, " of ", m);
    if (a.type == PipelineAction::Forward) {
      Tensor x;
      if (a.stage == 0) {
        x = inputs[a.microbatch];
        DTR_CHECK(x.defined(), "PipelineExecutor::step: micro-batch ", a.microbatch, " has no input on the first stage");
      } else {
        x = receive(false, a.stage, a.stage - 1, a.microbatch);
        if (with_grad && is_floating(x.dtype())) x.set_requires_grad(true);
      }
      const auto t0 = Clock::now();
      const bool last = a.stage == S - 1;
      DTR_CHECK(!last || targets.empty() || targets[a.microbatch].defined(), "PipelineExecutor: micro-batch ",
                a.microbatch, " has no targets on the last stage");
      Tensor y = last && !targets.empty() ? mod.call_list({x, targets[a.microbatch]}).at(0) : mod.call(x);
      if (last) {
        y = loss_fn(a.microbatch, y);
        DTR_CHECK(!with_grad || y.numel() == 1, "PipelineExecutor: the loss of micro-batch ", a.microbatch,
                  " has shape ", y.sizes(), ", expected a scalar");
        losses[a.microbatch] = y.detach();
      } else {
        transfer(false, a.stage + 1, a.microbatch, y);
      }
      stats_.compute_s += since(t0);
      if (with_grad) live[{a.stage, a.microbatch}] = {x, y};
    } else {
      auto it = live.find({a.stage, a.microbatch});
      DTR_CHECK(it != live.end(), "PipelineExecutor: backward ", a.str(), " before its forward");
      auto [x, y] = it->second;
      live.erase(it);
      Tensor gy;
      if (a.stage != S - 1) gy = receive(true, a.stage, a.stage + 1, a.microbatch);
      const auto t0 = Clock::now();
      if (y.requires_grad()) y.backward(gy);
      if (a.stage > 0) {
        Tensor gx = x.requires_grad() ? x.grad() : Tensor();
        if (!gx.defined()) gx = zeros_like(x);  // no path from the input to the output
        transfer(true, a.stage - 1, a.microbatch, gx);
      }
      stats_.compute_s += since(t0);
    }
    stats_.order.push_back(a);
  }
  DTR_CHECK(live.empty() && local.empty(), "PipelineExecutor: the schedule left ", live.size(),
            " micro-batches without backward");
  for (auto& s : sends) s.wait();
  stats_.total_s = since(t_step);
  if (stages_.back().stage_index != S - 1) return {};
  return losses;
}

}  // namespace dtr
