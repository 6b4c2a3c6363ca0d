#pragma once
// What dtr-train shows and records: the progress line of rank 0, metrics.jsonl, the PNG loss
// curve (gnuplot), and the MFU estimate.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

namespace dtr::train {

/// Figures of one optimizer step (rank 0's view; loss is the global token-mean).
struct StepMetrics {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0;    // all tokens of the global batch (inputs) / step time
  double mfu = 0;             // fraction of the peak, see mfu_estimate
  double peak_mem_gib = 0;    // max over ranks of dtr::memory_stats().peak
  double eta_s = 0;
  double step_time_s = 0;
  int64_t label_tokens = 0;   // tokens that carried loss in the global batch
  double val_loss = -1;       // < 0: not evaluated this step
};

/// MFU = 6 * n_params * tokens_per_s / (peak_flops_per_rank * world) (Kaplan et al. 2020
/// "6N" training FLOPs per token; attention FLOPs ignored). n_params counts every parameter
/// the forward uses (a frozen base still costs forward + input-gradient FLOPs, so 6N stays
/// the conventional estimate with LoRA too).
double mfu_estimate(double n_params, double tokens_per_s, double peak_flops_per_rank, int world);

/// A measured SGEMM peak of this process: the best of a few 512^3 f32 matmuls through
/// dtr::matmul, in FLOP/s (with the rank's threads). Used when logging.peak_tflops is 0.
double measure_sgemm_peak_flops();

/// The progress line: "\r" overwriting on a terminal, one plain line per call otherwise.
class ProgressPrinter {
 public:
  /// mode: "auto" (isatty(out)), "bar" (always \r) or "lines" (never).
  explicit ProgressPrinter(FILE* out = stdout, const std::string& mode = "auto");
  void step(const StepMetrics& m);
  /// A line that must not be overwritten (validation results, checkpoint notes).
  void note(const std::string& line);
  /// Ends the \r line (newline) when on a terminal.
  void finish();

 private:
  FILE* out_;
  bool tty_;
  bool open_line_ = false;
};

/// Appends one JSON object per line to `path`. On resume, lines with "step" > `keep_up_to`
/// are dropped first so the file stays one trajectory; fresh runs (keep_up_to = 0) truncate.
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, int64_t keep_up_to);
  void write(const nlohmann::json& j);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Plots train (and validation) loss against step from a metrics.jsonl into a PNG through
/// gnuplot. Returns false (and prints a warning) when gnuplot is missing or fails.
bool plot_loss_png(const std::string& metrics_file, const std::string& png);

/// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace dtr::train
