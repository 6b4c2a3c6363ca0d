#pragma once
// Small helpers for dtr-bench: a wall clock and the median of repeated runs. Benchmarks report
// ratios against a reference measured in the same run, because these machines are shared and
// noisy.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace dtr::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// User + system CPU seconds of this process so far (all threads).
inline double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// Median seconds per call of `fn` over `reps` timed repetitions (after `warmup` untimed calls).
/// Each repetition runs `inner` calls.
inline double median_seconds(const std::function<void()>& fn, int reps = 7, int inner = 1, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    for (int i = 0; i < inner; ++i) fn();
    t.push_back((now_s() - t0) / inner);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace dtr::bench
