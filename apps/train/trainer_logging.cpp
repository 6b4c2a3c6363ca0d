// dtr-train's per-step record: memory per rank, the metrics.jsonl line, the progress line and
// the warnings of a skipped or collapsing step.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "apps/train/trainer_impl.h"
#include "models/transformer/flops.h"
#include "tensor/allocator.h"
#include "tensor/cpu_allocator.h"

namespace dtr::train::detail {
namespace {

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

}  // namespace

RankMemory RankMemory::max_over_ranks() {
  RankMemory m;
  m.live_peak = all_ranks_max(memory_stats().peak);
  m.cached = all_ranks_max(cpu_cache_stats().cached_bytes);
  m.rss = all_ranks_max(proc_status_bytes("VmRSS:"));
  m.rss_peak = all_ranks_max(proc_status_bytes("VmHWM:"));
  return m;
}

void Trainer::log_step(const StepResult& s, double val, TrainingHealth& health) {
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
}  // namespace dtr::train::detail
