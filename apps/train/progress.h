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
  double loss = 0, lr = 0, grad_norm = 0;  // lr: the learning rate this step used
  double tokens_per_s = 0;    // input positions of the global batch, padding included / step time
  double label_tokens_per_s = 0;  // tokens that carried loss (labels != -100) / step time
  double mfu = -1;            // model FLOPs / (peak x world) (models/transformer/flops.h); < 0: no peak given
  double peak_mem_gib = 0;    // max over ranks of dtr::memory_stats().peak
  double eta_s = 0;
  double step_time_s = 0;
  int64_t label_tokens = 0;   // tokens that carried loss in the global batch
  double val_loss = -1;       // < 0: not evaluated this step
  double dispatch_bytes = -1; // expert parallelism: bytes the ep all-to-alls sent this step, summed over dp ranks; < 0: no ep
};

/// A measured SGEMM peak of this process: the best of a few 512^3 f32 matmuls through
/// dtr::matmul, in FLOP/s (with the rank's threads). Used only with logging.peak_tflops: measure
/// (on a loaded machine it measures the load, not the peak).
double measure_sgemm_peak_flops();

/// printf into a std::string of whatever length the output has (no fixed buffer to cut it).
std::string strformat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/// Whether a launcher started this process (mpirun / mpiexec / srun / PMI: OMPI_COMM_WORLD_SIZE,
/// PMI_SIZE, PMIX_RANK, SLURM_STEP_ID). Its stdout is then the launcher's pipe or pty, not the
/// user's terminal.
bool started_by_launcher();

/// The progress line: "\r" overwriting on a user's terminal, one plain line per call otherwise.
class ProgressPrinter {
 public:
  /// mode: "auto" (the \r line when `out` is a terminal and no launcher started the process:
  /// under mpirun the ranks' stdout is a pty whatever mpirun's own stdout is, so a log of
  /// `mpirun ... > log` would fill with \r), "bar" (always \r) or "lines" (never). "" takes
  /// DTR_PROGRESS, else auto.
  explicit ProgressPrinter(FILE* out = stdout, const std::string& mode = "auto");
  void step(const StepMetrics& m);
  /// A line that must not be overwritten (validation results, checkpoint notes).
  void note(const std::string& line);
  /// Ends the \r line (newline) when on a terminal.
  void finish();

 private:
  FILE* out_;
  bool tty_ = false;
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
