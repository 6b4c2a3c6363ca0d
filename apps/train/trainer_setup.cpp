// dtr-train's setup on one rank: the mesh and the parallelized model, AdamW, the sampler and the
// LR schedule, metrics.jsonl and the MFU peak.
#include <algorithm>

#include "apps/train/trainer_impl.h"
#include "models/transformer/flops.h"
#include "parallel/model_parallelizer.h"
#include "tensor/nn/to_device.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace dtr::train::detail {
namespace {

/// NeMo Automodel's LRSchedulerConfig.build: no lr_scheduler section = constant optimizer.lr;
/// otherwise warmup (default min(1000, total / 10) steps) from init_lr to optimizer.lr, then the
/// decay style down to min_lr at lr_decay_steps (default total steps); "constant" keeps
/// optimizer.lr after the warmup.
std::unique_ptr<optim::LRScheduler> make_scheduler(const Recipe& r, optim::Optimizer& opt, int64_t total_steps) {
  const auto& l = r.lr_scheduler;
  if (!l.enabled) return std::make_unique<optim::ConstantLR>(opt, r.optimizer.lr);
  const int64_t decay = std::max<int64_t>(1, l.lr_decay_steps > 0 ? l.lr_decay_steps : total_steps);
  const int64_t warmup_default = std::min<int64_t>(1000, total_steps / 10);
  const int64_t warmup = std::min(l.lr_warmup_steps >= 0 ? l.lr_warmup_steps : warmup_default, decay);
  const double lr = r.optimizer.lr;
  if (l.lr_decay_style == "constant")
    return std::make_unique<optim::WarmupLinearLR>(opt, lr, lr, warmup, decay, l.init_lr);
  if (l.lr_decay_style == "linear")
    return std::make_unique<optim::WarmupLinearLR>(opt, lr, l.min_lr, warmup, decay, l.init_lr);
  return std::make_unique<optim::WarmupCosineLR>(opt, lr, l.min_lr, warmup, decay, l.init_lr);
}

}  // namespace

void Trainer::setup_model() {
  plan.mesh.build_mesh(device());
  world_mesh = std::make_unique<DeviceMesh>(DeviceMesh::world("train_world"));
  auto t_build = Clock::now();
  model = build_model(r, plan);
  nn::module_to_device(*model, device());  // before parallelizing: FSDP / TP allocate on the mesh's device
  int64_t total = 0, trainable = 0;
  double active = 0;
  for (const auto& [n, p] : model->named_parameters()) {
    total += p.numel();
    active += active_weights(plan.config, n, p.numel());
    if (p.requires_grad()) trainable += p.numel();
    if (p.requires_grad()) trainable_active += active_weights(plan.config, n, p.numel());
  }
  if (ctx().tp_size > 1 && !ctx().tp_plan.empty()) {  // the same model on every rank: the same verdict
    try {
      recipe_tp_plan(*model, ctx());
    } catch (const Error& e) {
      throw AllRanksError(e.what());
    }
  }
  if (ctx().pp_size > 1) {
    pipe = std::make_unique<PipelinedModel>(model, ctx());
    params = pipe->trainable();
  } else {
    parallelize_model(*model, ctx());
    for (const auto& [n, p] : model->named_parameters())
      if (p.requires_grad()) params.push_back({n, p});
  }
  for (const auto& [n, p] : params) plist.push_back(p);
  DTR_CHECK(!params.empty(), "model: no trainable parameters (peft matched nothing?)");
  const std::string moe_active =
      plan.config.num_experts > 0
          ? strformat(" (%.0f active per token: top-%lld of %lld experts)", active,
                      (long long)plan.config.num_experts_per_tok, (long long)plan.config.num_experts)
          : std::string();
  note(strformat("model ready in %.1fs: %lld params%s, %lld trainable (%.3f%%); mesh %s on %s", seconds_since(t_build),
                 (long long)total, moe_active.c_str(), (long long)trainable, 100.0 * trainable / total,
                 ctx().str().c_str(), device().str().c_str()));
  // The load phase (build on meta + parallelize: each rank materialises its shards): its peak.
  const RankMemory lm = RankMemory::max_over_ranks();
  note(strformat("load phase peak per rank (max over ranks): live %.1f MiB, RSS %.1f MiB (cached %.1f MiB)",
                 lm.live_peak / 1048576.0, lm.rss_peak / 1048576.0, lm.cached / 1048576.0));
  load_memory = lm;
  ep_group = ctx().ep_size > 1 ? ctx().ep_mesh().group(0).get() : nullptr;
}

void Trainer::setup_optimizer() {
  optim::AdamWOptions ao;
  ao.lr = r.optimizer.lr;
  ao.beta1 = r.optimizer.beta1;
  ao.beta2 = r.optimizer.beta2;
  ao.eps = r.optimizer.eps;
  ao.weight_decay = r.optimizer.weight_decay;
  optimizer = std::make_unique<optim::AdamW>(plist, ao);
  const auto& st = r.step_scheduler;
  sampler = std::make_unique<data::DistributedSampler>(static_cast<int64_t>(train_set.size()), st.global_batch_size,
                                                       static_cast<int>(ctx().dp_rank()),
                                                       static_cast<int>(plan.dp_size), r.seed, r.dataset.shuffle);
  // NeMo Automodel's StepScheduler: training stops at whichever comes first, num_epochs
  // epochs or max_steps optimizer steps (0 = no step cap).
  total_steps = st.total_steps(sampler->batches_per_epoch());
  note("schedule: " + std::to_string(total_steps) + " steps (" + std::to_string(sampler->batches_per_epoch()) +
       " per epoch; num_epochs " + std::to_string(st.num_epochs) +
       (st.max_steps > 0 ? ", max_steps " + std::to_string(st.max_steps) : std::string()) + ")");
  sched = make_scheduler(r, *optimizer, total_steps);
  manual_seed(r.seed + 2);  // dropout stream
}

void Trainer::setup_metrics() {
  if (rank == 0) metrics = std::make_unique<MetricsWriter>(r.logging.metrics_file, step);
  peak_flops = r.logging.peak_tflops > 0   ? r.logging.peak_tflops * 1e12
               : r.logging.peak_tflops < 0 ? measure_sgemm_peak_flops()
                                           : 0.0;
  if (peak_flops == 0) note("MFU not shown: set logging.peak_tflops (per rank), or logging.peak_tflops: measure");
}
}  // namespace dtr::train::detail
