#include "apps/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>

#include "apps/train/checkpoint.h"
#include "apps/train/export.h"
#include "apps/train/health.h"
#include "apps/train/outputs.h"
#include "apps/train/pipeline_model.h"
#include "apps/train/progress.h"
#include "models/transformer/flops.h"
#include "apps/train/setup.h"
#include "dtensor/api.h"
#include "models/data/sampler.h"
#include "parallel/clip_grad.h"
#include "parallel/context_parallel.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/model_parallelizer.h"
#include "runtime/env.h"
#include "tensor/nn/moe.h"
#include "tensor/nn/to_device.h"
#include "tensor/allocator.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/optim/lr_scheduler.h"
#include "tensor/random.h"

namespace fs = std::filesystem;

namespace dtr::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// The value of a scalar loss (plain or distributed).
double scalar_value(const Tensor& t) {
  Tensor x = t.detach();
  if (x.is_distributed()) x = full_tensor(x);
  return x.item<double>();
}

/// Sum of `v` over the ranks that hold other tokens: data-parallel and context-parallel ranks.
double dp_sum(const MeshContext& ctx, double v) {
  if (ctx.dp_size * ctx.cp_size <= 1) return v;
  Tensor t = full({1}, v, TensorOptions(DType::f64));
  ctx.dp_cp_mesh().group(0)->all_reduce(t)->wait();
  return t.item<double>();
}

int64_t count_labels(const std::vector<data::Sample>& all, const std::vector<int64_t>& idx) {
  int64_t n = 0;
  for (int64_t i : idx)
    for (int32_t l : all[i].labels) n += l != data::kIgnoreIndex;
  return n;
}

std::vector<data::Sample> gather(const std::vector<data::Sample>& all, const std::vector<int64_t>& idx, size_t begin,
                                 size_t count) {
  std::vector<data::Sample> out;
  for (size_t i = begin; i < begin + count; ++i) out.push_back(all[idx[i]]);
  return out;
}

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

struct Trainer {
  const Recipe& r;
  const TrainOptions& opt;
  Plan& plan;
  std::vector<data::Sample>& train_set;
  std::vector<data::Sample>& val_set;
  int32_t pad_id = 0;
  int rank = 0, world = 1;
  /// distributed.pp_size > 1: this rank's pipeline stages, which replace the model's calls.
  std::unique_ptr<PipelinedModel> pipe;

  /// Packed rows are full already; unpacked ones are padded to the micro-batch's longest
  /// sample, rounded up to pad_seq_len_divisible and capped at seq_len.
  /// Context parallelism: rows are padded to a multiple of 2 cp as well (seq_len is one, checked in
  /// make_plan) and each rank keeps its load-balanced slice of input ids and labels.
  data::Batch make_batch(const DatasetRecipe& d, std::vector<data::Sample> samples) const {
    const MeshContext& ctx = plan.mesh;
    data::CollateOptions o;
    o.pad_id = pad_id;
    o.pad_seq_len_divisible = std::lcm(d.pad_seq_len_divisible, 2 * ctx.cp_size);
    o.max_length = d.seq_len;
    data::Batch b = data::collate(samples, o);
    if (ctx.cp_size > 1) {
      const int64_t r = ctx.cp_mesh().coordinate(0);
      b.input_ids = context_parallel_shard(b.input_ids, 1, ctx.cp_size, r).contiguous();
      b.labels = context_parallel_shard(b.labels, 1, ctx.cp_size, r).contiguous();
      b.num_label_tokens = 0;
      for (int64_t l : b.labels.to_vector<int64_t>()) b.num_label_tokens += l != data::kIgnoreIndex;
    }
    return batch_to_device(std::move(b));
  }

  /// The model's device (model.device; cuda: the GPU of this rank's local rank).
  Device device() const { return r.model.device == "cuda" ? Device::cuda(cuda_device()) : Device::cpu(); }

  /// Data in: the batch's tensors copied to the model's device (the only host -> device copies
  /// of a step besides the first use of each RoPE length).
  data::Batch batch_to_device(data::Batch b) const {
    const Device dev = device();
    if (dev.is_cpu()) return b;
    for (Tensor* t : {&b.input_ids, &b.labels, &b.position_ids, &b.document_ids})
      if (t->defined()) *t = t->to(dev);
    return b;
  }

  /// Token-mean validation loss over the validation batches (every dp rank its slice).
  double validate(LlamaForCausalLM& model) {
    const MeshContext& ctx = plan.mesh;
    const int64_t per = r.step_scheduler.local_batch_size * plan.dp_size;
    int64_t vb = std::min<int64_t>(r.step_scheduler.global_batch_size, val_set.size());
    vb = vb / per * per;
    if (vb == 0) return -1;
    int64_t nb = static_cast<int64_t>(val_set.size()) / vb;
    if (r.step_scheduler.val_batches > 0) nb = std::min(nb, r.step_scheduler.val_batches);
    const int64_t share = vb / plan.dp_size, dpr = ctx.dp_rank();
    model.eval();
    NoGradGuard no_grad;
    double sum = 0, tokens = 0;
    for (int64_t b = 0; b < nb; ++b) {
      std::vector<int64_t> idx(share);
      for (int64_t i = 0; i < share; ++i) idx[i] = b * vb + dpr * share + i;
      if (pipe) {  // the rows of this validation batch as micro-batches through the stages
        std::vector<data::Batch> mbs;
        for (int64_t m = 0; m < share; m += r.step_scheduler.local_batch_size)
          mbs.push_back(make_batch(r.validation_dataset, gather(val_set, idx, m, r.step_scheduler.local_batch_size)));
        auto [s, n] = pipe->evaluate(mbs);
        sum += s;
        tokens += n;
        continue;
      }
      for (int64_t m = 0; m < share; m += r.step_scheduler.local_batch_size) {
        data::Batch batch = make_batch(r.validation_dataset, gather(val_set, idx, m, r.step_scheduler.local_batch_size));
        // Every rank runs the forward (FSDP's all-gathers, cp's K/V all-gather are collective),
        // also when its rows (its cp slice) hold no label token.
        Tensor logits = model.call(batch.input_ids);
        if (batch.num_label_tokens == 0) continue;
        sum += scalar_value(causal_lm_loss(logits, batch.labels, false)) * batch.num_label_tokens;
        tokens += batch.num_label_tokens;
      }
    }
    model.train();
    sum = dp_sum(ctx, sum);
    tokens = dp_sum(ctx, tokens);
    return tokens > 0 ? sum / tokens : -1;
  }

  int run() {
    MeshContext& ctx = plan.mesh;
    ctx.build_mesh(device());
    DeviceMesh world_mesh = DeviceMesh::world("train_world");
    ProcessGroup& wg = *world_mesh.group(0);
    ProgressPrinter progress(stdout, opt.progress);
    auto note = [&](const std::string& s) {
      if (rank == 0) progress.note(s);
    };

    auto t_build = Clock::now();
    auto model = build_model(r, plan);
    nn::module_to_device(*model, device());  // before parallelizing: FSDP / TP allocate on the mesh's device
    int64_t total = 0, trainable = 0;
    double active = 0, trainable_active = 0;  // MoE: a token uses k of E experts (flops.h)
    for (const auto& [n, p] : model->named_parameters()) {
      total += p.numel();
      active += active_weights(plan.config, n, p.numel());
      if (p.requires_grad()) trainable += p.numel();
      if (p.requires_grad()) trainable_active += active_weights(plan.config, n, p.numel());
    }
    if (ctx.tp_size > 1 && !ctx.tp_plan.empty()) {  // the same model on every rank: the same verdict
      try {
        recipe_tp_plan(*model, ctx);
      } catch (const Error& e) {
        throw AllRanksError(e.what());
      }
    }
    NamedParams params;
    std::vector<Tensor> plist;
    if (ctx.pp_size > 1) {
      pipe = std::make_unique<PipelinedModel>(model, ctx);
      params = pipe->trainable();
    } else {
      parallelize_model(*model, ctx);
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
                   ctx.str().c_str(), device().str().c_str()));
    // Expert parallelism: bytes the ep all-to-alls send per step (the group's counters).
    ProcessGroup* ep_group = ctx.ep_size > 1 ? ctx.ep_mesh().group(0).get() : nullptr;

    optim::AdamWOptions ao;
    ao.lr = r.optimizer.lr;
    ao.beta1 = r.optimizer.beta1;
    ao.beta2 = r.optimizer.beta2;
    ao.eps = r.optimizer.eps;
    ao.weight_decay = r.optimizer.weight_decay;
    optim::AdamW optimizer(plist, ao);

    const auto& st = r.step_scheduler;
    data::DistributedSampler sampler(static_cast<int64_t>(train_set.size()), st.global_batch_size,
                                     static_cast<int>(ctx.dp_rank()), static_cast<int>(plan.dp_size), r.seed,
                                     r.dataset.shuffle);
    // NeMo Automodel's StepScheduler: training stops at whichever comes first, num_epochs
    // epochs or max_steps optimizer steps (0 = no step cap).
    const int64_t total_steps = st.total_steps(sampler.batches_per_epoch());
    note("schedule: " + std::to_string(total_steps) + " steps (" + std::to_string(sampler.batches_per_epoch()) +
         " per epoch; num_epochs " + std::to_string(st.num_epochs) +
         (st.max_steps > 0 ? ", max_steps " + std::to_string(st.max_steps) : std::string()) + ")");
    auto sched = make_scheduler(r, optimizer, total_steps);
    manual_seed(r.seed + 2);  // dropout stream

    int64_t step = 0;
    if (r.checkpoint.enabled && !opt.no_resume) {
      // The newest checkpoint every rank can read; a damaged one (unreadable metadata, a
      // missing or truncated shard) is skipped with a warning, all ranks alike.
      const std::vector<std::string> dirs = checkpoints_newest_first(r.checkpoint.checkpoint_dir);
      std::string first_problem;
      for (const auto& dir : dirs) {
        const std::string why = checkpoint_problem(dir);
        if (all_ranks_max(why.empty() ? 0 : 1) != 0) {
          const std::string w = why.empty() ? "damaged on another rank" : why;
          if (first_problem.empty()) first_problem = dir + ": " + w;
          if (rank == 0)
            std::fprintf(stderr, "dtr-train: warning: checkpoint %s is damaged (%s); trying the previous one\n",
                         dir.c_str(), w.c_str());
          continue;
        }
        nlohmann::json extra = load_checkpoint(dir, params, optimizer);
        step = extra["step"].get<int64_t>();
        sampler.load_state_dict(extra["sampler"]);
        set_generator_state({extra["rng"]["seed"].get<uint64_t>(), extra["rng"]["offset"].get<uint64_t>()});
        sched->set_step(extra["lr_step"].get<int64_t>());
        note("resumed from " + dir + " (step " + std::to_string(step) + ")");
        first_problem.clear();
        break;
      }
      if (!first_problem.empty())
        throw AllRanksError("no checkpoint under " + r.checkpoint.checkpoint_dir + " can be loaded (newest: " +
                            first_problem + "); repair or remove them, or start over with --no-resume --overwrite");
    }
    sched->set_step(step);
    if (step >= total_steps && step > 0) {
      // A finished job run again: nothing to train. Its exports are written again only when
      // missing (killed after the last checkpoint); rank 0 looks, every rank follows.
      bool missing = false;
      if (rank == 0) {
        std::error_code ec;
        missing = (r.peft.enabled && !fs::exists(fs::path(r.checkpoint.adapter_dir) / "adapter_config.json", ec)) ||
                  (r.checkpoint.save_consolidated &&
                   !fs::exists(fs::path(r.checkpoint.checkpoint_dir) / "consolidated" / "config.json", ec));
      }
      missing = all_ranks_max(missing ? 1 : 0) != 0;
      if (!missing) {
        note("nothing to do: the run is complete (step " + std::to_string(step) + " of " + std::to_string(total_steps) +
             " in " + r.checkpoint.checkpoint_dir + "); its outputs are left as they are. Raise "
             "step_scheduler.max_steps / num_epochs to train further, or --no-resume --overwrite to start over");
        wg.barrier()->wait();
        return 0;
      }
      note("the run is complete (step " + std::to_string(step) + " of " + std::to_string(total_steps) +
           "); writing its missing exports");
    }

    std::unique_ptr<MetricsWriter> metrics;
    if (rank == 0) metrics = std::make_unique<MetricsWriter>(r.logging.metrics_file, step);
    // MFU needs a peak: logging.peak_tflops per rank, or a start-up SGEMM only when asked
    // (peak_tflops: measure; a measurement on a loaded machine is not a peak). None: no MFU.
    const double peak_flops = r.logging.peak_tflops > 0    ? r.logging.peak_tflops * 1e12
                              : r.logging.peak_tflops < 0  ? measure_sgemm_peak_flops()
                                                           : 0.0;
    if (peak_flops == 0) note("MFU not shown: set logging.peak_tflops (per rank), or logging.peak_tflops: measure");
    const double max_norm = r.optimizer.max_grad_norm > 0 ? r.optimizer.max_grad_norm
                                                           : std::numeric_limits<double>::infinity();

    auto save = [&](int64_t s) {
      nlohmann::json extra;
      extra["step"] = s;
      extra["sampler"] = sampler.state_dict();
      const auto g = generator_state();
      extra["rng"] = {{"seed", g.seed}, {"offset", g.offset}};
      extra["lr_step"] = sched->last_step();
      extra["mesh"] = ctx.str();
      extra["recipe"] = dump_recipe(r);
      save_checkpoint(r.checkpoint.checkpoint_dir, s, params, optimizer, extra, r.checkpoint.keep_last, wg);
      note("checkpoint " + r.checkpoint.checkpoint_dir + "/step_" + std::to_string(s));
    };

    const bool has_val = r.validation_dataset.enabled && !val_set.empty();
    const int64_t first = step;
    if (has_val && step == 0) {  // the baseline the validation curve starts from
      const double val = validate(*model);
      if (rank == 0 && val >= 0) {
        metrics->write({{"step", 0}, {"val_loss", val}});
        progress.note(strformat("step 0: validation loss %.4f", val));
      }
    }
    TrainingHealth health(st.on_nonfinite);
    double last_loss = NAN, last_val = NAN;
    int64_t last_val_step = -1;
    const auto t_loop = Clock::now();  // ETA: wall time per step so far, validation and checkpoints included
    int64_t last_saved = step;
    model->train();
    while (step < total_steps) {
      const auto t0 = Clock::now();
      if (ep_group) ep_group->counters().reset();
      const data::SamplerState ss = sampler.state();
      const int64_t n_global = count_labels(train_set, sampler.global_batch(ss.epoch, ss.batch));
      DTR_CHECK(n_global > 0, "dataset: global batch ", ss.batch, " of epoch ", ss.epoch, " has no label tokens");
      const std::vector<int64_t> mine = sampler.next();
      double loss_sum = 0, rows_tokens = 0;  // rows_tokens: positions run, padding included
      if (pipe) {
        // The step's rows as micro-batches of pp_microbatch_size rows through the schedule.
        const int64_t rows = plan.pp_microbatch_rows;
        std::vector<data::Batch> mbs;
        std::vector<double> weights;
        for (int64_t k = 0; k * rows < plan.grad_accum * st.local_batch_size; ++k) {
          mbs.push_back(make_batch(r.dataset, gather(train_set, mine, k * rows, rows)));
          rows_tokens += static_cast<double>(mbs.back().input_ids.numel());
          weights.push_back(static_cast<double>(mbs.back().num_label_tokens) * plan.dp_size / n_global);
        }
        loss_sum = pipe->step(mbs, weights);
      }
      for (int64_t m = 0; m < (pipe ? 0 : plan.grad_accum); ++m) {
        set_model_gradient_sync(*model, ctx, m + 1 == plan.grad_accum);
        data::Batch batch = make_batch(r.dataset, gather(train_set, mine, m * st.local_batch_size, st.local_batch_size));
        rows_tokens += static_cast<double>(batch.input_ids.numel());
        if (batch.num_label_tokens == 0) {
          // Nothing to learn here, but FSDP still needs the collective forward/backward.
          Tensor logits = model->call(batch.input_ids);
          Tensor zero = mul(sum(logits), 0.0);
          zero.backward();
          continue;
        }
        Tensor logits = model->call(batch.input_ids);
        Tensor loss = causal_lm_loss(logits, batch.labels, false);
        // FSDP averages gradients over dp x cp (dp_shard_cp), so this weight makes their mean the
        // gradient of the global token mean.
        const double w = static_cast<double>(batch.num_label_tokens) * plan.dp_size * ctx.cp_size / n_global;
        Tensor objective = mul(loss, w);
        // MoE: + router_aux_loss_coef * the load-balancing loss of this micro-batch, averaged over
        // micro-batches (and, by the gradient averaging, over dp ranks).
        // (Added as plain tensors: under loss parallelism the loss is a DTensor, the aux loss is not.)
        if (Tensor aux = nn::moe_auxiliary_loss(*model, plan.config.router_aux_loss_coef, 0.0); aux.defined())
          objective = add(objective.is_distributed() ? full_tensor(objective) : objective,
                          mul(aux.to(objective.dtype()), 1.0 / static_cast<double>(plan.grad_accum)));
        objective.backward();
        loss_sum += scalar_value(loss) * batch.num_label_tokens;
      }
      finish_model_backward(*model, ctx);
      const double grad_norm = pipe ? pipe->clip_grad_norm(plist, max_norm) : clip_grad_norm(plist, max_norm);
      const double loss = dp_sum(ctx, loss_sum) / n_global;
      const double step_tokens = dp_sum(ctx, rows_tokens);
      // Summed over the dp ranks (one tp coordinate): counts, dispatch and combine, forward,
      // backward and activation-checkpoint recomputation.
      const double dispatch_bytes =
          ep_group ? dp_sum(ctx, static_cast<double>(ep_group->counters().nbytes(CommKind::all_to_all))) : -1;
      // The same loss and global norm on every rank: the same decision everywhere.
      const bool update = health.admit(step + 1, loss, grad_norm);
      const double step_lr = optimizer.lr();  // the lr this step used (the scheduler moves on below)
      if (update) optimizer.step();
      optimizer.zero_grad();
      sched->step();
      ++step;
      if (update) last_loss = loss;
      const double dt = seconds_since(t0);

      // Automodel's StepScheduler: a checkpoint every ckpt_every_steps and at the last step of
      // each epoch (save_checkpoint_every_epoch); validation at val_every_steps and at every
      // checkpoint step.
      const bool epoch_end = step % sampler.batches_per_epoch() == 0;
      const bool ckpt_step = r.checkpoint.enabled && ((st.ckpt_every_steps > 0 && step % st.ckpt_every_steps == 0) ||
                                                      (st.save_checkpoint_every_epoch && epoch_end && step < total_steps));
      double val = -1;
      if (has_val && ((st.val_every_steps > 0 && step % st.val_every_steps == 0) || ckpt_step)) val = validate(*model);
      const int64_t peak = all_ranks_max(memory_stats().peak);
      if (rank == 0) {
        StepMetrics m;
        m.step = step;
        m.total_steps = total_steps;
        m.loss = loss;
        m.lr = step_lr;
        m.grad_norm = grad_norm;
        m.step_time_s = dt;
        m.tokens_per_s = step_tokens / dt;
        m.label_tokens_per_s = static_cast<double>(n_global) / dt;
        // Rows are padded per micro-batch: the attention term takes the step's mean row length.
        const double row = step_tokens / static_cast<double>(st.global_batch_size);
        const double step_flops =
            llama_train_flops_per_token(plan.config, r.peft.enabled, trainable_active, row) * step_tokens;
        m.mfu = peak_flops > 0 ? step_flops / dt / (peak_flops * world) : -1;
        m.peak_mem_gib = static_cast<double>(peak) / (1024.0 * 1024.0 * 1024.0);
        m.eta_s = seconds_since(t_loop) / static_cast<double>(step - first) * static_cast<double>(total_steps - step);
        m.label_tokens = n_global;
        m.dispatch_bytes = dispatch_bytes;
        nlohmann::json j = {{"step", step},
                            {"lr", m.lr},
                            {"tokens_per_s", m.tokens_per_s},
                            {"label_tokens_per_s", m.label_tokens_per_s},
                            {"peak_mem_bytes", peak},
                            {"step_time_s", dt},
                            {"label_tokens", n_global},
                            {"epoch", ss.epoch}};
        if (m.mfu >= 0) j["mfu"] = m.mfu;
        if (dispatch_bytes >= 0) j["dispatch_bytes"] = static_cast<int64_t>(dispatch_bytes);
        if (std::isfinite(loss)) j["loss"] = loss;  // JSON has no NaN; a skipped step says so instead
        if (std::isfinite(grad_norm)) j["grad_norm"] = grad_norm;
        if (!update) {
          j["skipped"] = true;
          std::fprintf(stderr, "dtr-train: warning: step %lld skipped: loss %g, gradient norm %g (on_nonfinite: skip)\n",
                       (long long)step, std::isnan(loss) ? NAN : loss, std::isnan(grad_norm) ? NAN : grad_norm);
        } else if (auto w = health.collapse_warning(step, loss, grad_norm)) {
          std::fprintf(stderr, "dtr-train: warning: %s\n", w->c_str());
        }
        if (val >= 0) j["val_loss"] = val;
        metrics->write(j);
        if (step % r.logging.every_steps == 0 || step == total_steps) progress.step(m);
        if (val >= 0) {
          progress.note(strformat("step %lld: validation loss %.4f", (long long)step, val));
        }
      }
      if (val >= 0) {
        last_val = val;
        last_val_step = step;
      }
      if (ckpt_step) {
        save(step);
        last_saved = step;
      }
      if (opt.stop_after > 0 && step >= opt.stop_after && step < total_steps) {
        if (rank == 0) progress.finish();
        note("stopping after step " + std::to_string(step) + " (--stop-after)");
        return 0;
      }
    }
    if (rank == 0) progress.finish();

    if (has_val && last_val_step != step && step > first) {
      const double val = validate(*model);
      if (val >= 0) last_val = val;  // -1: no full validation batch (fewer samples than local x dp)
      if (rank == 0 && val >= 0) {
        metrics->write({{"step", step}, {"val_loss", val}});
        progress.note(strformat("step %lld: validation loss %.4f", (long long)step, val));
      }
    }
    if (r.checkpoint.enabled && last_saved != step) save(step);

    if (pipe && (r.peft.enabled || r.checkpoint.save_consolidated)) pipe->gather_to_first_stage_rank();
    for (const auto& line : export_final(*model, r)) note(line);
    if (rank == 0) {
      if (plot_loss_png(r.logging.metrics_file, r.logging.plot_file)) note("loss curve: " + r.logging.plot_file);
      const std::string loss_txt =
          std::isnan(last_loss) ? "no training step in this run" : strformat("train loss %.4f", last_loss);
      note(strformat("done: %lld steps, %s%s, metrics %s", (long long)step, loss_txt.c_str(),
                     std::isnan(last_val) ? "" : strformat(", validation loss %.4f", last_val).c_str(),
                     r.logging.metrics_file.c_str()));
    }
    wg.barrier()->wait();
    return 0;
  }
};

}  // namespace

int run_training(const Recipe& r, const TrainOptions& opt) {
  const int rank = dtr::rank(), world = dtr::world_size();
  Plan plan;
  std::vector<data::Sample> train_set, val_set;
  int32_t pad_id = 0;
  try {
    plan = make_plan(r, world);
    if (opt.dry_run) {
      if (rank == 0) std::printf("%s", dry_run_report(r, plan).c_str());
      return 0;
    }
    train_set = load_samples(r, r.dataset, "dataset", &pad_id);
    if (r.validation_dataset.enabled) val_set = load_samples(r, r.validation_dataset, "validation_dataset");
    DTR_CHECK(static_cast<int64_t>(train_set.size()) >= r.step_scheduler.global_batch_size, "dataset: ",
              train_set.size(), " samples are fewer than step_scheduler.global_batch_size=",
              r.step_scheduler.global_batch_size, " (", r.dataset.paths.front(), ")");
    int64_t max_id = 0;
    for (const auto& s : train_set)
      for (int32_t t : s.input_ids) max_id = std::max<int64_t>(max_id, t);
    DTR_CHECK(max_id < plan.config.vocab_size, "dataset: token id ", max_id, " >= the model's vocab_size=",
              plan.config.vocab_size, " (", plan.model_source, "; dataset.tokenizer does not match the model)");
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "dtr-train: error: %s\n", e.what());
    return 1;
  }
  // The output directory: locked by rank 0 for the run, earlier outputs never overwritten
  // silently. Rank 0 decides, every rank learns the outcome (a bounded world all-reduce).
  std::unique_ptr<OutputLock> lock;
  {
    std::string err;
    std::vector<std::string> notes;
    if (rank == 0) {
      try {
        notes = prepare_outputs(r, !opt.no_resume, opt.overwrite, lock);
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    if (all_ranks_max(err.empty() ? 0 : 1) != 0) {
      if (rank == 0) std::fprintf(stderr, "dtr-train: error: %s\n", err.c_str());
      return 1;
    }
    for (const auto& n : notes) std::printf("%s\n", n.c_str());
  }
  try {
    Trainer t{r, opt, plan, train_set, val_set, pad_id, rank, world};
    return t.run();
  } catch (const AllRanksError& e) {  // every rank is here with the same message
    if (rank == 0) std::fprintf(stderr, "dtr-train: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] dtr-train: error: %s\n", rank, e.what());
    std::fflush(stderr);
    if (world > 1) abort_job("dtr-train failed");
    return 1;
  }
}

}  // namespace dtr::train
