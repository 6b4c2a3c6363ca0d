#include "apps/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "tensor/cpu_allocator.h"
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

/// A "VmRSS:" / "VmHWM:" line of /proc/self/status in bytes (0 where /proc is not there).
int64_t proc_status_bytes(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  int64_t kb = 0;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0) kb = std::atoll(line + n);
  std::fclose(f);
  return kb * 1024;
}

/// Memory of this rank, max over the ranks (collective): live allocator bytes (peak since the
/// last reset), the CPU allocator's cached bytes, resident set and its high-water mark.
struct RankMemory {
  int64_t live_peak = 0, cached = 0, rss = 0, rss_peak = 0;
  static RankMemory max_over_ranks() {
    RankMemory m;
    m.live_peak = all_ranks_max(memory_stats().peak);
    m.cached = all_ranks_max(cpu_cache_stats().cached_bytes);
    m.rss = all_ranks_max(proc_status_bytes("VmRSS:"));
    m.rss_peak = all_ranks_max(proc_status_bytes("VmHWM:"));
    return m;
  }
};

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

/// One optimizer step's figures, the same on every rank (sums over dp x cp).
struct StepResult {
  double loss = NAN, grad_norm = NAN, lr = 0;
  double step_tokens = 0;      // positions run, padding included
  double dispatch_bytes = -1;  // expert parallelism: the ep all-to-alls' bytes (-1 without ep)
  int64_t label_tokens = 0, epoch = 0;
  bool updated = false;  // false: skipped by on_nonfinite: skip
  double seconds = 0;
};

/// dtr-train on one rank. run() reads as the job does: setup (mesh, model, optimizer, schedule),
/// resume, then per step train_step (micro-batches, gradient reduction, clipping, AdamW) ->
/// evaluate when due -> log_step -> checkpoint when due, then the end of the run (last
/// validation and checkpoint, exports).
struct Trainer {
  const Recipe& r;
  const TrainOptions& opt;
  Plan& plan;
  std::vector<data::Sample>& train_set;
  std::vector<data::Sample>& val_set;
  int32_t pad_id = 0;
  int rank = 0, world = 1;

  Trainer(const Recipe& recipe, const TrainOptions& options, Plan& p, std::vector<data::Sample>& train,
          std::vector<data::Sample>& val, int32_t pad, int rank_, int world_)
      : r(recipe), opt(options), plan(p), train_set(train), val_set(val), pad_id(pad), rank(rank_), world(world_) {}

  // Built by the setup steps.
  std::unique_ptr<DeviceMesh> world_mesh;
  std::unique_ptr<ProgressPrinter> progress;
  std::shared_ptr<LlamaForCausalLM> model;
  NamedParams params;          // trainable, with FQNs (checkpoints)
  std::vector<Tensor> plist;   // the same tensors (optimizer, clipping)
  double trainable_active = 0;  // MoE: a token uses k of E experts (flops.h)
  ProcessGroup* ep_group = nullptr;  // expert parallelism: the ep all-to-all counters
  RankMemory load_memory;            // the load phase's peak (max over ranks)
  /// distributed.pp_size > 1: this rank's pipeline stages, which replace the model's calls.
  std::unique_ptr<PipelinedModel> pipe;
  std::unique_ptr<optim::AdamW> optimizer;
  std::unique_ptr<data::DistributedSampler> sampler;
  std::unique_ptr<optim::LRScheduler> sched;
  int64_t total_steps = 0;
  // The loop's state.
  int64_t step = 0, first_step = 0, last_saved = 0, last_val_step = -1;
  double last_loss = NAN, last_val = NAN;
  std::unique_ptr<MetricsWriter> metrics;
  double peak_flops = 0;
  Clock::time_point t_loop;

  const MeshContext& ctx() const { return plan.mesh; }
  bool has_val() const { return r.validation_dataset.enabled && !val_set.empty(); }
  void note(const std::string& s) {
    if (rank == 0) progress->note(s);
  }

  /// Packed rows are full already and carry their documents (position / document ids, handed
  /// to the attention layers: per-document RoPE and a block-diagonal causal mask); unpacked ones
  /// are padded to the micro-batch's longest sample, rounded up to pad_seq_len_divisible and
  /// capped at seq_len.
  /// Context parallelism: rows are padded to a multiple of 2 cp as well (seq_len is one, checked in
  /// make_plan) and each rank keeps its load-balanced slice of input ids and labels (and of the
  /// position / document ids of packed rows).
  data::Batch make_batch(const DatasetRecipe& d, std::vector<data::Sample> samples) const {
    data::CollateOptions o;
    o.pad_id = pad_id;
    o.pad_seq_len_divisible = std::lcm(d.pad_seq_len_divisible, 2 * ctx().cp_size);
    o.max_length = d.seq_len;
    o.documents = d.packed_sequence_size > 0;
    data::Batch b = data::collate(samples, o);
    if (ctx().cp_size > 1) {
      const int64_t r = ctx().cp_mesh().coordinate(0);
      for (Tensor* t : {&b.input_ids, &b.labels, &b.position_ids, &b.document_ids})  // packed rows: their documents
        if (t->defined()) *t = context_parallel_shard(*t, 1, ctx().cp_size, r).contiguous();
      b.num_label_tokens = 0;
      for (int64_t l : b.labels.to_vector<int64_t>()) b.num_label_tokens += l != data::kIgnoreIndex;
    }
    b = batch_to_device(std::move(b));
    if (model) set_attention_documents(*model, b.position_ids, b.document_ids);  // undefined: none
    return b;
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
  double validate() {
    const int64_t per = r.step_scheduler.local_batch_size * plan.dp_size;
    int64_t vb = std::min<int64_t>(r.step_scheduler.global_batch_size, val_set.size());
    vb = vb / per * per;
    if (vb == 0) return -1;
    int64_t nb = static_cast<int64_t>(val_set.size()) / vb;
    if (r.step_scheduler.val_batches > 0) nb = std::min(nb, r.step_scheduler.val_batches);
    const int64_t share = vb / plan.dp_size, dpr = ctx().dp_rank();
    model->eval();
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
        if (batch.num_label_tokens == 0) {
          model->call(batch.input_ids);
          continue;
        }
        sum += scalar_value(causal_lm_loss(*model, batch.input_ids, batch.labels, false)) * batch.num_label_tokens;
        tokens += batch.num_label_tokens;
      }
    }
    model->train();
    sum = dp_sum(ctx(), sum);
    tokens = dp_sum(ctx(), tokens);
    return tokens > 0 ? sum / tokens : -1;
  }

  /// Validation outside a training step (the step-0 baseline, the end of the run): metrics line
  /// and note on rank 0. Returns the loss, -1 without a full validation batch.
  double validate_and_log(int64_t at_step) {
    const double val = validate();
    if (rank == 0 && val >= 0) {
      metrics->write({{"step", at_step}, {"val_loss", val}});
      progress->note(strformat("step %lld: validation loss %.4f", (long long)at_step, val));
    }
    return val;
  }

  /// The mesh, the model (built, the recipe's TP plan checked, parallelized) and its trainable
  /// parameters.
  void setup_model() {
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

  /// AdamW over the trainable parameters, the data sampler, the step count and the LR schedule.
  void setup_optimizer() {
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

  /// Loads the newest checkpoint every rank can read (step, sampler, generator, LR step); a
  /// damaged one (unreadable metadata, a missing or truncated shard) is skipped with a warning,
  /// all ranks alike. Errors (AllRanksError): none of them can be loaded.
  void resume() {
    if (!r.checkpoint.enabled || opt.no_resume) return;
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
      nlohmann::json extra = load_checkpoint(dir, params, *optimizer);
      step = extra["step"].get<int64_t>();
      sampler->load_state_dict(extra["sampler"]);
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

  /// A finished job run again: true when there is nothing to do. Its exports are written again
  /// only when missing (killed after the last checkpoint); rank 0 looks, every rank follows.
  bool already_complete() {
    if (step < total_steps || step == 0) return false;
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
      return true;
    }
    note("the run is complete (step " + std::to_string(step) + " of " + std::to_string(total_steps) +
         "); writing its missing exports");
    return false;
  }

  /// metrics.jsonl (rank 0) and the FLOP peak MFU is measured against: logging.peak_tflops per
  /// rank, or a start-up SGEMM only when asked (peak_tflops: measure; a measurement on a loaded
  /// machine is not a peak). None: no MFU.
  void setup_metrics() {
    if (rank == 0) metrics = std::make_unique<MetricsWriter>(r.logging.metrics_file, step);
    peak_flops = r.logging.peak_tflops > 0   ? r.logging.peak_tflops * 1e12
                 : r.logging.peak_tflops < 0 ? measure_sgemm_peak_flops()
                                             : 0.0;
    if (peak_flops == 0) note("MFU not shown: set logging.peak_tflops (per rank), or logging.peak_tflops: measure");
  }

  /// Forward and backward of one micro-batch; returns its loss x label tokens (0 when it holds
  /// none). The objective is the loss weighted n_micro x dp x cp / n_global: FSDP averages
  /// gradients over dp x cp (dp_shard_cp), so their mean is the gradient of the global token mean.
  double micro_batch(const data::Batch& batch, int64_t n_global) {
    if (batch.num_label_tokens == 0) {
      // Nothing to learn here, but FSDP still needs the collective forward/backward.
      Tensor logits = model->call(batch.input_ids);
      Tensor zero = mul(sum(logits), 0.0);
      zero.backward();
      return 0;
    }
    // The fused head (CausalLM::forward_list): the [tokens, vocab] logits are never formed.
    Tensor loss = causal_lm_loss(*model, batch.input_ids, batch.labels, false);
    const double w = static_cast<double>(batch.num_label_tokens) * plan.dp_size * ctx().cp_size / n_global;
    Tensor objective = mul(loss, w);
    // MoE: + router_aux_loss_coef * the load-balancing loss of this micro-batch, averaged over
    // micro-batches (and, by the gradient averaging, over dp ranks).
    // (Added as plain tensors: under loss parallelism the loss is a DTensor, the aux loss is not.)
    if (Tensor aux = nn::moe_auxiliary_loss(*model, plan.config.router_aux_loss_coef, 0.0); aux.defined())
      objective = add(objective.is_distributed() ? full_tensor(objective) : objective,
                      mul(aux.to(objective.dtype()), 1.0 / static_cast<double>(plan.grad_accum)));
    objective.backward();
    return scalar_value(loss) * batch.num_label_tokens;
  }

  /// One optimizer step over the next global batch: grad_accum micro-batches (gradient sync on
  /// the last), the strategy's backward completion, clipping, the health check, AdamW, LR step.
  StepResult train_step(TrainingHealth& health) {
    const auto t0 = Clock::now();
    const auto& st = r.step_scheduler;
    StepResult s;
    if (ep_group) ep_group->counters().reset();
    const data::SamplerState ss = sampler->state();
    s.epoch = ss.epoch;
    s.label_tokens = count_labels(train_set, sampler->global_batch(ss.epoch, ss.batch));
    DTR_CHECK(s.label_tokens > 0, "dataset: global batch ", ss.batch, " of epoch ", ss.epoch, " has no label tokens");
    const std::vector<int64_t> mine = sampler->next();
    double loss_sum = 0, rows_tokens = 0;
    if (pipe) {
      // The step's rows as micro-batches of pp_microbatch_size rows through the schedule.
      const int64_t rows = plan.pp_microbatch_rows;
      std::vector<data::Batch> mbs;
      std::vector<double> weights;
      for (int64_t k = 0; k * rows < plan.grad_accum * st.local_batch_size; ++k) {
        mbs.push_back(make_batch(r.dataset, gather(train_set, mine, k * rows, rows)));
        rows_tokens += static_cast<double>(mbs.back().input_ids.numel());
        weights.push_back(static_cast<double>(mbs.back().num_label_tokens) * plan.dp_size / s.label_tokens);
      }
      loss_sum = pipe->step(mbs, weights);
    }
    for (int64_t m = 0; m < (pipe ? 0 : plan.grad_accum); ++m) {
      set_model_gradient_sync(*model, ctx(), m + 1 == plan.grad_accum);
      data::Batch batch = make_batch(r.dataset, gather(train_set, mine, m * st.local_batch_size, st.local_batch_size));
      rows_tokens += static_cast<double>(batch.input_ids.numel());
      loss_sum += micro_batch(batch, s.label_tokens);
    }
    const double max_norm = r.optimizer.max_grad_norm > 0 ? r.optimizer.max_grad_norm
                                                           : std::numeric_limits<double>::infinity();
    s.grad_norm = pipe ? pipe->clip_grad_norm(plist, max_norm) : clip_grad_norm(plist, max_norm);
    s.loss = dp_sum(ctx(), loss_sum) / s.label_tokens;
    s.step_tokens = dp_sum(ctx(), rows_tokens);
    // Summed over the dp ranks (one tp coordinate): counts, dispatch and combine, forward,
    // backward and activation-checkpoint recomputation.
    if (ep_group) s.dispatch_bytes = dp_sum(ctx(), static_cast<double>(ep_group->counters().nbytes(CommKind::all_to_all)));
    // The same loss and global norm on every rank: the same decision everywhere.
    s.updated = health.admit(step + 1, s.loss, s.grad_norm);
    s.lr = optimizer->lr();  // the lr this step used (the scheduler moves on below)
    if (s.updated) optimizer->step();
    optimizer->zero_grad();
    sched->step();
    ++step;
    if (s.updated) last_loss = s.loss;
    s.seconds = seconds_since(t0);
    return s;
  }

  /// Rank 0: the step's metrics.jsonl line, the progress line, warnings (skipped step, collapse).
  void log_step(const StepResult& s, double val, TrainingHealth& health) {
    const RankMemory mem = RankMemory::max_over_ranks();
    const int64_t peak = mem.live_peak;
    if (rank != 0) return;
    const auto& st = r.step_scheduler;
    const double dt = s.seconds;
    StepMetrics m;
    m.step = step;
    m.total_steps = total_steps;
    m.loss = s.loss;
    m.lr = s.lr;
    m.grad_norm = s.grad_norm;
    m.step_time_s = dt;
    m.tokens_per_s = s.step_tokens / dt;
    m.label_tokens_per_s = static_cast<double>(s.label_tokens) / dt;
    // Rows are padded per micro-batch: the attention term takes the step's mean row length.
    const double row = s.step_tokens / static_cast<double>(st.global_batch_size);
    const double step_flops =
        llama_train_flops_per_token(plan.config, r.peft.enabled, trainable_active, row) * s.step_tokens;
    m.mfu = peak_flops > 0 ? step_flops / dt / (peak_flops * world) : -1;
    m.peak_mem_gib = static_cast<double>(peak) / (1024.0 * 1024.0 * 1024.0);
    m.eta_s = seconds_since(t_loop) / static_cast<double>(step - first_step) * static_cast<double>(total_steps - step);
    m.label_tokens = s.label_tokens;
    m.dispatch_bytes = s.dispatch_bytes;
    nlohmann::json j = {{"step", step},
                        {"lr", m.lr},
                        {"tokens_per_s", m.tokens_per_s},
                        {"label_tokens_per_s", m.label_tokens_per_s},
                        {"peak_mem_bytes", peak},
                        {"cached_mem_bytes", mem.cached},
                        {"rss_bytes", mem.rss},
                        {"peak_rss_bytes", mem.rss_peak},
                        {"load_peak_mem_bytes", load_memory.live_peak},
                        {"load_peak_rss_bytes", load_memory.rss_peak},
                        {"step_time_s", dt},
                        {"label_tokens", s.label_tokens},
                        {"epoch", s.epoch}};
    if (m.mfu >= 0) j["mfu"] = m.mfu;
    if (s.dispatch_bytes >= 0) j["dispatch_bytes"] = static_cast<int64_t>(s.dispatch_bytes);
    if (std::isfinite(s.loss)) j["loss"] = s.loss;  // JSON has no NaN; a skipped step says so instead
    if (std::isfinite(s.grad_norm)) j["grad_norm"] = s.grad_norm;
    if (!s.updated) {
      j["skipped"] = true;
      std::fprintf(stderr, "dtr-train: warning: step %lld skipped: loss %g, gradient norm %g (on_nonfinite: skip)\n",
                   (long long)step, std::isnan(s.loss) ? NAN : s.loss, std::isnan(s.grad_norm) ? NAN : s.grad_norm);
    } else if (auto w = health.collapse_warning(step, s.loss, s.grad_norm)) {
      std::fprintf(stderr, "dtr-train: warning: %s\n", w->c_str());
    }
    if (val >= 0) j["val_loss"] = val;
    metrics->write(j);
    if (step % r.logging.every_steps == 0 || step == total_steps) progress->step(m);
    if (val >= 0) progress->note(strformat("step %lld: validation loss %.4f", (long long)step, val));
  }

  /// Automodel's StepScheduler: a checkpoint every ckpt_every_steps and at the last step of each
  /// epoch (save_checkpoint_every_epoch).
  bool checkpoint_due() const {
    const auto& st = r.step_scheduler;
    const bool epoch_end = step % sampler->batches_per_epoch() == 0;
    return r.checkpoint.enabled && ((st.ckpt_every_steps > 0 && step % st.ckpt_every_steps == 0) ||
                                    (st.save_checkpoint_every_epoch && epoch_end && step < total_steps));
  }

  /// Validation at val_every_steps and at every checkpoint step.
  bool validation_due(bool ckpt_step) const {
    const int64_t every = r.step_scheduler.val_every_steps;
    return has_val() && ((every > 0 && step % every == 0) || ckpt_step);
  }

  /// The sharded checkpoint of this step (parameters, AdamW state, sampler, generator, LR step).
  void save() {
    nlohmann::json extra;
    extra["step"] = step;
    extra["sampler"] = sampler->state_dict();
    const auto g = generator_state();
    extra["rng"] = {{"seed", g.seed}, {"offset", g.offset}};
    extra["lr_step"] = sched->last_step();
    extra["mesh"] = ctx().str();
    extra["recipe"] = dump_recipe(r);
    save_checkpoint(r.checkpoint.checkpoint_dir, step, params, *optimizer, extra, r.checkpoint.keep_last,
                    *world_mesh->group(0));
    note("checkpoint " + r.checkpoint.checkpoint_dir + "/step_" + std::to_string(step));
    last_saved = step;
  }

  /// After the last step: the final validation and checkpoint when not done at that step, the
  /// exports (adapter, consolidated), the loss plot and the closing line.
  void finish_run() {
    if (has_val() && last_val_step != step && step > first_step) {
      const double val = validate_and_log(step);
      if (val >= 0) last_val = val;  // -1: no full validation batch (fewer samples than local x dp)
    }
    if (r.checkpoint.enabled && last_saved != step) save();
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
  }

  int run() {
    progress = std::make_unique<ProgressPrinter>(stdout, opt.progress);
    setup_model();
    setup_optimizer();
    resume();
    sched->set_step(step);
    if (already_complete()) {
      world_mesh->group(0)->barrier()->wait();
      return 0;
    }
    setup_metrics();
    first_step = last_saved = step;
    if (has_val() && step == 0) validate_and_log(0);  // the baseline the validation curve starts from
    TrainingHealth health(r.step_scheduler.on_nonfinite);
    t_loop = Clock::now();  // ETA: wall time per step so far, validation and checkpoints included
    model->train();
    while (step < total_steps) {
      const StepResult s = train_step(health);
      const bool ckpt_step = checkpoint_due();
      const double val = validation_due(ckpt_step) ? validate() : -1;
      log_step(s, val, health);
      if (val >= 0) {
        last_val = val;
        last_val_step = step;
      }
      if (ckpt_step) save();
      if (opt.stop_after > 0 && step >= opt.stop_after && step < total_steps) {
        if (rank == 0) progress->finish();
        note("stopping after step " + std::to_string(step) + " (--stop-after)");
        return 0;
      }
    }
    if (rank == 0) progress->finish();
    finish_run();
    world_mesh->group(0)->barrier()->wait();
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
    DTR_CHECK(opt.world_size == 0 || opt.dry_run, "--world-size plans without running: use it with --dry-run");
    plan = make_plan(r, opt.world_size > 0 ? opt.world_size : world);
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
    Trainer t(r, opt, plan, train_set, val_set, pad_id, rank, world);
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
