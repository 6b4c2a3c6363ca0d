// Factories: constant fills, arange, and Philox-addressed random tensors.
#include <cmath>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/meta.h"
#include "tensor/ops/cpu/copy_kernel.h"
#include "tensor/random.h"

namespace dtr {
namespace {

Tensor finish(Tensor t, const TensorOptions& opt) {
  if (opt.device != Device::cpu()) t = t.to(opt.device);
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}

/// Fills a CPU tensor of global index range [offset, offset+n) from f(seed, index).
template <class F>
Tensor random_fill(const Shape& shape, const TensorOptions& opt, F f) {
  DTR_CHECK(is_floating(opt.dtype), "random factory: dtype must be floating, got ", opt.dtype);
  const int64_t n = shape_numel(shape);
  const GeneratorState g = generator_state();
  const uint64_t base = reserve_random_offsets(static_cast<uint64_t>(n));
  Tensor t = empty(shape, TensorOptions(DType::f64));
  double* p = t.data<double>();
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) p[i] = f(g.seed, base + static_cast<uint64_t>(i));
  return finish(t.to(opt.dtype), opt.with_device(opt.device));
}

/// Under MetaInitGuard: a meta tensor that records `source`.
Tensor meta_factory(const Shape& shape, const TensorOptions& opt, std::shared_ptr<const InitSource> source) {
  Tensor t = meta_tensor(shape, opt.dtype, opt.device, std::move(source));
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}

/// Under MetaInitGuard: reserves the Philox offsets the eager draw would take and records them.
template <class Make>
Tensor meta_random(const Shape& shape, const TensorOptions& opt, Make make) {
  DTR_CHECK(is_floating(opt.dtype), "random factory: dtype must be floating, got ", opt.dtype);
  const GeneratorState g = generator_state();
  const uint64_t base = reserve_random_offsets(static_cast<uint64_t>(shape_numel(shape)));
  return meta_factory(shape, opt, make(g.seed, base));
}

}  // namespace

/// Filled on its own device (the fill_ kernel of that device: no host buffer, no copy).
Tensor full(const Shape& shape, double value, TensorOptions opt) {
  if (meta_init_enabled()) return meta_factory(shape, opt, constant_init(value));
  Tensor t = empty(shape, TensorOptions(opt.dtype).with_device(opt.device));
  static const OpDef* fill = op_def("fill_");
  dispatch(OpCall{fill, {t}, {value}});
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opt) { return full(shape, 0.0, opt); }
Tensor ones(const Shape& shape, TensorOptions opt) { return full(shape, 1.0, opt); }

Tensor arange(double start, double end, double step, TensorOptions opt) {
  DTR_CHECK(step != 0, "arange: step must be non-zero");
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((end - start) / step)));
  // Written on its own device by the "arange" kernel of that device (CPU or CUDA).
  Tensor t = empty({n}, TensorOptions(opt.dtype).with_device(opt.device));
  static const OpDef* op = op_def("arange");
  dispatch(OpCall{op, {t}, {start, step}});
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}

namespace {
/// arange kernel: out[i] = start + i * step, computed in f64 and converted to out's dtype.
std::vector<Tensor> k_arange(const OpCall& c) {
  Tensor out = c.inputs[0];
  const int64_t n = out.numel();
  Tensor v = empty({n}, TensorOptions(DType::f64));
  double* p = v.data<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = c.f(0) + static_cast<double>(i) * c.f(1);
  cpu::copy_strided(out, v);
  return {out};
}
DTR_REGISTER_KERNEL_EXACT("arange", DeviceType::CPU, k_arange);
}  // namespace

namespace {
/// full_like kernel: a constant tensor of the input's (local) shape, dtype and device.
std::vector<Tensor> k_full_like(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  return {full(x.sizes(), c.f(0), TensorOptions(x.dtype()).with_device(x.device()))};
}
DTR_REGISTER_KERNEL_EXACT("full_like", DeviceType::CPU, k_full_like);
}  // namespace

Tensor full_like(const Tensor& t, double v) {
  // Dispatched, so a distributed input gets a distributed result with its placements
  // (Partial -> Replicate: a constant is not a pending sum).
  static const OpDef* op = op_def("full_like");
  return dispatch1(OpCall{op, {t.detach()}, {v}});
}
Tensor zeros_like(const Tensor& t) { return full_like(t, 0.0); }
Tensor ones_like(const Tensor& t) { return full_like(t, 1.0); }
Tensor empty_like(const Tensor& t) { return full_like(t, 0.0); }

Tensor rand(const Shape& shape, TensorOptions opt) { return uniform(shape, 0.0, 1.0, opt); }
Tensor randn(const Shape& shape, TensorOptions opt) { return normal(shape, 0.0, 1.0, opt); }

Tensor uniform(const Shape& shape, double low, double high, TensorOptions opt) {
  if (meta_init_enabled())
    return meta_random(shape, opt, [=](uint64_t s, uint64_t o) { return uniform_init(low, high, s, o); });
  return random_fill(shape, opt, [=](uint64_t s, uint64_t i) { return low + (high - low) * philox_uniform(s, i); });
}

Tensor normal(const Shape& shape, double mean, double std, TensorOptions opt) {
  if (meta_init_enabled())
    return meta_random(shape, opt, [=](uint64_t s, uint64_t o) { return normal_init(mean, std, s, o); });
  return random_fill(shape, opt, [=](uint64_t s, uint64_t i) { return mean + std * philox_normal(s, i); });
}

}  // namespace dtr
