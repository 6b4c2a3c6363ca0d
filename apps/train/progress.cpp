#include "apps/train/progress.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdlib>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "tensor/env_vars.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace dtr::train {

std::string strformat(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
  va_end(ap2);
  return out;
}

bool started_by_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_ID"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

double measure_sgemm_peak_flops() {
  const int64_t n = 512;
  Tensor a = full({n, n}, 0.5), b = full({n, n}, 0.25);
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor c = matmul(a, b);
    (void)c.data_ptr();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  return buf;
}

ProgressPrinter::ProgressPrinter(FILE* out, const std::string& mode_arg) : out_(out) {
  std::string mode = mode_arg.empty() ? env::choice("DTR_PROGRESS") : mode_arg;
  if (mode.empty()) mode = "auto";
  DTR_CHECK(mode == "auto" || mode == "bar" || mode == "lines", "--progress: expected auto, bar or lines, got '", mode,
            "'");
  tty_ = mode == "bar" || (mode == "auto" && isatty(fileno(out)) != 0 && !started_by_launcher());
}

void ProgressPrinter::step(const StepMetrics& m) {
  const std::string mfu = m.mfu >= 0 ? strformat(" | MFU %.1f%%", 100.0 * m.mfu) : std::string();
  const std::string a2a =
      m.dispatch_bytes >= 0 ? strformat(" | dispatch %.2f MiB", m.dispatch_bytes / (1024.0 * 1024.0)) : std::string();
  const std::string line = strformat(
      "step %lld/%lld | loss %.4f | lr %.3g | grad norm %.3f | %.0f tok/s (padding incl.), %.0f label tok/s%s%s | "
      "peak mem %.0f MiB | ETA %s",
      (long long)m.step, (long long)m.total_steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.label_tokens_per_s,
      mfu.c_str(), a2a.c_str(), m.peak_mem_gib * 1024.0, format_duration(m.eta_s).c_str());
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    open_line_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::note(const std::string& line) {
  if (tty_ && open_line_) std::fprintf(out_, "\n");
  open_line_ = false;
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (tty_ && open_line_) std::fprintf(out_, "\n");
  open_line_ = false;
  std::fflush(out_);
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t keep_up_to) : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  std::vector<std::string> kept;
  if (keep_up_to > 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.value("step", int64_t{0}) <= keep_up_to) kept.push_back(line);
      } catch (...) {
        // a torn last line of a killed run: dropped
      }
    }
  }
  std::ofstream out(path, std::ios::trunc);
  DTR_CHECK(out.good(), "cannot write metrics file '", path, "'");
  for (const auto& l : kept) out << l << "\n";
}

void MetricsWriter::write(const nlohmann::json& j) {
  std::ofstream out(path_, std::ios::app);
  out << j.dump() << "\n";
}

bool plot_loss_png(const std::string& metrics_file, const std::string& png) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::fprintf(stderr, "dtr-train: warning: gnuplot not found, no loss plot (%s)\n", png.c_str());
    return false;
  }
  // Two data files (train, validation) of "step loss" columns.
  const std::string train_dat = png + ".train.dat", val_dat = png + ".val.dat";
  {
    std::ifstream in(metrics_file);
    std::ofstream t(train_dat), v(val_dat);
    for (std::string line; std::getline(in, line);) {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.contains("loss")) t << j["step"] << " " << j["loss"] << "\n";
        if (j.contains("val_loss")) v << j["step"] << " " << j["val_loss"] << "\n";
      } catch (...) {
      }
    }
  }
  const bool has_val = std::filesystem::file_size(val_dat) > 0;
  std::ostringstream script;
  script << "set terminal pngcairo size 900,540 noenhanced; set output '" << png << "';"
         << "set xlabel 'step'; set ylabel 'loss'; set grid; set key top right;"
         << "plot '" << train_dat << "' using 1:2 with lines lw 2 title 'train'";
  if (has_val) script << ", '" << val_dat << "' using 1:2 with linespoints lw 2 pt 7 title 'validation'";
  const std::string cmd = "gnuplot -e \"" + script.str() + "\" 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string err;
  char buf[256];
  while (p && std::fgets(buf, sizeof buf, p)) err += buf;
  const int rc = p ? pclose(p) : -1;
  std::filesystem::remove(train_dat);
  std::filesystem::remove(val_dat);
  if (rc != 0) {
    std::fprintf(stderr, "dtr-train: warning: gnuplot failed (%s): %s\n", png.c_str(), err.c_str());
    return false;
  }
  return true;
}

}  // namespace dtr::train
