#include "tensor/profiler.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace dtr {
namespace detail {
std::atomic<bool> g_op_profiling{false};
}  // namespace detail

namespace {
struct Acc {
  int64_t calls = 0, ns = 0;
};
std::mutex& prof_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<std::string, Acc>& prof_table() {
  static std::unordered_map<std::string, Acc> t;
  return t;
}
}  // namespace

void set_op_profiling(bool on) { detail::g_op_profiling.store(on, std::memory_order_relaxed); }
bool op_profiling_enabled() { return detail::g_op_profiling.load(std::memory_order_relaxed); }

void reset_op_profile() {
  std::lock_guard<std::mutex> lock(prof_mutex());
  prof_table().clear();
}

std::vector<OpProfileEntry> op_profile() {
  std::vector<OpProfileEntry> out;
  {
    std::lock_guard<std::mutex> lock(prof_mutex());
    for (const auto& [n, a] : prof_table()) out.push_back({n, a.calls, static_cast<double>(a.ns) * 1e-9});
  }
  std::sort(out.begin(), out.end(), [](const OpProfileEntry& a, const OpProfileEntry& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  return out;
}

void detail::record_op_time(const std::string& name, int64_t ns) {
  std::lock_guard<std::mutex> lock(prof_mutex());
  Acc& a = prof_table()[name];
  a.calls += 1;
  a.ns += ns;
}

}  // namespace dtr
