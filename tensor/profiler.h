#pragma once
// Opt-in op profiler: wall time and call count per op name, measured around the outermost
// dispatch() / run_kernel() of the calling thread (nested calls, e.g. the dtensor layer's
// run_kernel or the low-precision casts inside run_kernel, are charged to the outer op). Off by
// default; when off the dispatcher pays one relaxed atomic load per call. Used by
// `dtr-bench train-step` for its per-op table. Source of the idea: torch.profiler's
// key_averages() over aten ops (and its profile_memory / with_flops counters).
// Each entry also sums, over the outermost local kernels run for the op (run_kernel calls not
// nested in another run_kernel: the op's own kernel, or the dtensor layer's local kernels), the
// bytes moved as read from tensor sizes (op_bytes_moved) and the matmul / attention FLOPs
// (op_flops).
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
  double bytes = 0;  // reads + writes of the op's tensors (op_bytes_moved), summed over calls
  double flops = 0;  // matmul / attention FLOPs (op_flops), summed over calls
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

struct OpCall;
class Tensor;
/// Bytes a kernel call reads and writes, from tensor sizes: every defined input and output
/// (numel x itemsize, the viewed elements, not the whole storage). An output sharing storage
/// with an input is a view of it (both counted 0: no data moves) unless the op is in-place
/// (name ending in '_': the input is read and written); embedding's weight counts the rows it
/// gathers (the output's bytes), not the table. Caches and re-reads inside the kernel
/// are not counted: this is the least traffic the op's interface implies.
double op_bytes_moved(const OpCall& call, const std::vector<Tensor>& outputs);
/// FLOPs of a matmul-like or attention call (0 for other ops): mm / bmm / grouped_mm /
/// grouped_mm_swiglu 2 x numel(a) x size(b, -1), grouped_mm_pair the sum of its two products; sdpa 2 x B x Hq x P x (D + Dv) and sdpa_backward twice that
/// (dq, dk, dv, dP; the recomputed scores not counted), P = the (query, key) pairs the causal /
/// sliding-window mask leaves visible (document ids not applied: an upper bound).
double op_flops(const OpCall& call);

namespace detail {
extern std::atomic<bool> g_op_profiling;
/// Adds `ns` nanoseconds, one call, `bytes` and `flops` to op `name`.
void record_op_time(const std::string& name, int64_t ns, double bytes = 0, double flops = 0);
}  // namespace detail

}  // namespace dtr
