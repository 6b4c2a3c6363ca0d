#include "tensor/profiler.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "tensor/dispatch.h"
#include "tensor/tensor.h"

namespace dtr {
namespace detail {
std::atomic<bool> g_op_profiling{false};
}  // namespace detail

namespace {
struct Acc {
  int64_t calls = 0, ns = 0;
  double bytes = 0, flops = 0;
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
    for (const auto& [n, a] : prof_table()) out.push_back({n, a.calls, static_cast<double>(a.ns) * 1e-9, a.bytes, a.flops});
  }
  std::sort(out.begin(), out.end(), [](const OpProfileEntry& a, const OpProfileEntry& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  return out;
}

void detail::record_op_time(const std::string& name, int64_t ns, double bytes, double flops) {
  std::lock_guard<std::mutex> lock(prof_mutex());
  Acc& a = prof_table()[name];
  a.calls += 1;
  a.ns += ns;
  a.bytes += bytes;
  a.flops += flops;
}

double op_bytes_moved(const OpCall& call, const std::vector<Tensor>& outputs) {
  const std::string& name = call.op->name;
  const bool inplace = !name.empty() && name.back() == '_';
  std::vector<bool> viewed(call.inputs.size(), false);
  double bytes = 0;
  for (const Tensor& o : outputs) {
    if (!o.defined() || o.is_distributed()) continue;
    bool view = false;
    for (size_t i = 0; i < call.inputs.size(); ++i) {
      const Tensor& t = call.inputs[i];
      if (!inplace && t.defined() && !t.is_distributed() && o.storage() && t.storage() == o.storage()) {
        viewed[i] = view = true;
      }
    }
    if (!view) bytes += static_cast<double>(o.nbytes());
  }
  // embedding {ids, weight}: a gather reads the output's worth of weight rows, not the table.
  const bool gather = name == "embedding" && outputs.size() == 1 && outputs[0].defined();
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    const Tensor& t = call.inputs[i];
    if (!t.defined() || t.is_distributed() || viewed[i]) continue;
    bytes += static_cast<double>(gather && i == 1 ? outputs[0].nbytes() : t.nbytes());
  }
  return bytes;
}

double op_flops(const OpCall& call) {
  const std::string& n = call.op->name;
  const auto& in = call.inputs;
  // a product a @ b of these ops: 2 x a's elements x b's last dim (mm [M, K] x [K, N]; bmm;
  // grouped_mm [T, K] x [G, K, N] and [K, T] x [T, N]: every row of a meets N columns once).
  auto product = [&](size_t a, size_t b) {
    if (in.size() <= b || !in[a].defined() || !in[b].defined() || in[b].dim() == 0) return 0.0;
    return 2.0 * static_cast<double>(in[a].numel()) * static_cast<double>(in[b].size(-1));
  };
  // grouped_mm_swiglu {x, w, weights}: its grouped_mm (the SwiGLU counts 0 like the pointwise ops);
  // grouped_mm_pair {a1, b1, a2, b2}: two grouped_mm products.
  if (n == "mm" || n == "bmm" || n == "grouped_mm" || n == "grouped_mm_swiglu") return product(0, 1);
  if (n == "grouped_mm_pair") return product(0, 1) + product(2, 3);
  const bool fwd = n == "sdpa", bwd = n == "sdpa_backward";
  if (!fwd && !bwd) return 0;
  const size_t q0 = bwd ? 1 : 0;  // sdpa_backward: {g, q, k, v, ...}
  if (in.size() < q0 + 3) return 0;
  const Tensor &q = in[q0], &k = in[q0 + 1], &v = in[q0 + 2];
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return 0;
  const int64_t T = q.size(2), S = k.size(2);
  const bool causal = call.b(0);
  const int64_t window = call.attrs.size() > 2 ? call.i(2) : 0;
  const int64_t off = call.attrs.size() > 3 ? call.i(3) : S - T;
  double pairs = 0;  // visible (query, key) pairs of one head
  for (int64_t i = 0; i < T; ++i) {
    const int64_t end = causal ? std::clamp<int64_t>(i + off + 1, 0, S) : S;
    const int64_t begin = window > 0 ? std::clamp<int64_t>(i + off - window + 1, 0, S) : 0;
    pairs += static_cast<double>(std::max<int64_t>(0, end - begin));
  }
  const double f = 2.0 * static_cast<double>(q.size(0) * q.size(1)) * pairs *
                   static_cast<double>(q.size(3) + v.size(3));
  return bwd ? 2 * f : f;
}

}  // namespace dtr
