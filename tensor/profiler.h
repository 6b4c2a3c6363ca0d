#pragma once
// Opt-in op profiler: wall time and call count per op name, measured around the outermost
// dispatch() / run_kernel() of the calling thread (nested calls, e.g. the dtensor layer's
// run_kernel or the low-precision casts inside run_kernel, are charged to the outer op). Off by
// default; when off the dispatcher pays one relaxed atomic load per call. Used by
// `dtr-bench train-step` for its per-op table. Source of the idea: torch.profiler's
// key_averages() over aten ops.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace dtr {

/// Aggregated time of one op name since the last reset.
struct OpProfileEntry {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;
};

/// Turns profiling on or off (process-wide; any thread's dispatches are recorded).
void set_op_profiling(bool on);
bool op_profiling_enabled();
/// Clears the aggregated times.
void reset_op_profile();
/// The aggregated times, largest first.
std::vector<OpProfileEntry> op_profile();

/// Enables profiling for its lifetime (restores the previous state on destruction).
class OpProfilerScope {
 public:
  OpProfilerScope() : prev_(op_profiling_enabled()) { set_op_profiling(true); }
  ~OpProfilerScope() { set_op_profiling(prev_); }
  OpProfilerScope(const OpProfilerScope&) = delete;
  OpProfilerScope& operator=(const OpProfilerScope&) = delete;

 private:
  bool prev_;
};

namespace detail {
extern std::atomic<bool> g_op_profiling;
/// Adds `ns` nanoseconds and one call to op `name`.
void record_op_time(const std::string& name, int64_t ns);
}  // namespace detail

}  // namespace dtr
