#include "tensor/dispatch.h"
#include "tensor/dispatch_mode.h"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>

#include "tensor/profiler.h"

namespace dtr {
namespace {
std::map<std::string, std::unique_ptr<OpDef>>& registry() {
  static std::map<std::string, std::unique_ptr<OpDef>> r;
  return r;
}
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
DistributedDispatcher* g_dist = nullptr;

/// Depth of profiled dispatch()/run_kernel() calls on this thread (only the outermost is timed).
thread_local int t_profile_depth = 0;
/// Depth of run_kernel() calls on this thread while profiling (only the outermost is counted).
thread_local int t_kernel_depth = 0;
/// Bytes and FLOPs of the outermost kernels of the op being timed on this thread.
thread_local double t_op_bytes = 0, t_op_flops = 0;

/// Increments a per-thread depth counter for its lifetime.
struct DepthGuard {
  int& depth;
  explicit DepthGuard(int& d) : depth(d) { ++depth; }
  ~DepthGuard() { --depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

/// Times `fn` for op `call` when profiling is on and this is the outermost call of the thread.
template <class Fn>
std::vector<Tensor> profiled(const OpCall& call, Fn&& fn) {
  if (!detail::g_op_profiling.load(std::memory_order_relaxed) || t_profile_depth > 0) return fn();
  const DepthGuard depth(t_profile_depth);
  t_op_bytes = t_op_flops = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Tensor> out = fn();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  detail::record_op_time(call.op->name, static_cast<int64_t>(ns), t_op_bytes, t_op_flops);
  return out;
}

/// Runs the kernel of `call`; when profiling, the outermost kernel of the thread adds its bytes
/// and FLOPs to the op being timed.
template <class Fn>
std::vector<Tensor> counted(const OpCall& call, Fn&& fn) {
  if (!detail::g_op_profiling.load(std::memory_order_relaxed) || t_kernel_depth > 0) return fn();
  const DepthGuard depth(t_kernel_depth);
  std::vector<Tensor> out = fn();
  t_op_bytes += op_bytes_moved(call, out);
  t_op_flops += op_flops(call);
  return out;
}

std::vector<Tensor> run_kernel_impl(const OpCall& call);

Tensor cast_local(const Tensor& t, DType dt) {
  static const OpDef* cast = op_def("to_dtype");
  return run_kernel(OpCall{cast, {t}, {dt}})[0];
}
}  // namespace

OpDef* op_def(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& slot = registry()[name];
  if (!slot) {
    slot = std::make_unique<OpDef>();
    slot->name = name;
  }
  return slot.get();
}

void register_kernel(const std::string& name, DeviceType dev, Kernel k, bool upcast) {
  OpDef* d = op_def(name);
  d->kernels[static_cast<int>(dev)] = k;
  // The flag describes the CPU kernel only (CUDA kernels always receive bf16/f16 as they are),
  // so a CUDA registration must not overwrite what the CPU kernel asked for.
  if (dev == DeviceType::CPU) d->upcast_low_precision = upcast;
}

std::vector<std::string> registered_ops(DeviceType dev) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> out;
  for (auto& [n, d] : registry())
    if (d->kernels[static_cast<int>(dev)]) out.push_back(n);
  return out;
}

void set_distributed_dispatcher(DistributedDispatcher* d) { g_dist = d; }
DistributedDispatcher* distributed_dispatcher() { return g_dist; }

std::vector<Tensor> run_kernel(const OpCall& call) {
  return profiled(call, [&] { return counted(call, [&] { return run_kernel_impl(call); }); });
}

namespace {
std::vector<Tensor> run_kernel_impl(const OpCall& call) {
  Device dev = Device::cpu();
  bool have_dev = false;
  DType low = DType::f32;
  bool any_low = false;
  for (const Tensor& t : call.inputs) {
    if (!t.defined()) continue;
    DTR_CHECK(!t.is_distributed(), call.name(), ": run_kernel got a distributed tensor");
    if (!have_dev) {
      dev = t.device();
      have_dev = true;
    } else {
      DTR_CHECK(t.device() == dev, call.name(), ": inputs on different devices (", dev, " and ", t.device(), ")");
    }
    if (is_low_precision(t.dtype()) && !any_low) {
      any_low = true;
      low = t.dtype();
    }
  }
  Kernel k = call.op->kernels[static_cast<int>(dev.type)];
  DTR_CHECK(k != nullptr, call.name(), ": no kernel for device ", dev);
  if (!(any_low && dev.is_cpu() && call.op->upcast_low_precision)) return k(call);
  // CPU low precision: compute in f32, return in the inputs' low-precision dtype.
  OpCall up = call;
  for (Tensor& t : up.inputs)
    if (t.defined() && is_low_precision(t.dtype())) t = cast_local(t, DType::f32);
  std::vector<Tensor> outs = k(up);
  for (Tensor& o : outs)
    if (o.defined() && o.dtype() == DType::f32) o = cast_local(o, low);
  return outs;
}
}  // namespace

namespace {
thread_local DispatchMode* t_dispatch_mode = nullptr;
}  // namespace

DispatchMode* set_dispatch_mode(DispatchMode* mode) {
  DispatchMode* prev = t_dispatch_mode;
  t_dispatch_mode = mode;
  return prev;
}

std::vector<Tensor> dispatch(const OpCall& call) {
  if (DispatchMode* mode = t_dispatch_mode) {
    DispatchModeGuard inactive(nullptr);
    return mode->dispatch(call);
  }
  if (g_dist) {
    for (const Tensor& t : call.inputs)
      if (t.defined() && t.is_distributed()) return profiled(call, [&] { return g_dist->dispatch(call); });
  }
  return run_kernel(call);
}

Tensor dispatch1(const OpCall& call) { return dispatch(call).at(0); }

}  // namespace dtr
