#pragma once
// The op dispatcher: every op is an OpCall (op + input tensors + attributes) that goes
//   autograd recording (in the op's public function, above this layer)
//   -> the distributed dispatcher when any input is a distributed tensor (dtensor layer)
//   -> the kernel registered for (op, device type).
// Kernels register by op name (registry, no switch on names). Source of the layering:
// PyTorch's dispatcher (Autograd key above Python/__torch_dispatch__ above backend kernels).
#include <string>
#include <variant>
#include <vector>

#include "tensor/tensor.h"

namespace dtr {

/// A non-tensor argument of an op. Every attribute is part of the sharding-propagation cache
/// key, so scalars must be passed here, never captured elsewhere.
using Attr = std::variant<int64_t, double, bool, Shape, DType, std::string>;

struct OpCall;
/// A kernel computes the outputs of an op on local (non-distributed) tensors of one device.
using Kernel = std::vector<Tensor> (*)(const OpCall&);

/// Registry entry of an op. Pointers to OpDefs are stable for the life of the process.
struct OpDef {
  std::string name;
  Kernel kernels[kNumDeviceTypes] = {nullptr, nullptr};
  /// When true (default) a CPU kernel receives bf16/f16 floating inputs upcast to f32 and its
  /// floating outputs are cast back to the low-precision dtype (f32 accumulation). Set by the
  /// CPU registration only; CUDA kernels always receive bf16/f16 inputs unchanged.
  bool upcast_low_precision = true;
};

/// One call of an op: the op, its tensor inputs (undefined tensors allowed for optional
/// inputs) and its attributes.
struct OpCall {
  const OpDef* op = nullptr;
  std::vector<Tensor> inputs;
  std::vector<Attr> attrs;

  const char* name() const { return op->name.c_str(); }
  int64_t i(size_t k) const { return std::get<int64_t>(attrs.at(k)); }
  double f(size_t k) const { return std::get<double>(attrs.at(k)); }
  bool b(size_t k) const { return std::get<bool>(attrs.at(k)); }
  const Shape& shape(size_t k) const { return std::get<Shape>(attrs.at(k)); }
  DType dtype(size_t k) const { return std::get<DType>(attrs.at(k)); }
  const std::string& s(size_t k) const { return std::get<std::string>(attrs.at(k)); }
};

/// Returns the registry entry for `name`, creating it on first use.
OpDef* op_def(const std::string& name);
/// Registers the kernel of `name` for a device type.
void register_kernel(const std::string& name, DeviceType dev, Kernel k, bool upcast_low_precision = true);
/// Names of all ops that have a kernel for `dev` (for coverage checks).
std::vector<std::string> registered_ops(DeviceType dev);

/// The hook through which the dtensor layer receives ops on distributed tensors.
class DistributedDispatcher {
 public:
  virtual ~DistributedDispatcher() = default;
  /// Runs `call` (some input is distributed): propagate placements, redistribute inputs,
  /// run the local kernel, wrap the outputs.
  virtual std::vector<Tensor> dispatch(const OpCall& call) = 0;
  /// Brings a gradient arriving for distributed leaf `leaf` to the leaf's own placements
  /// (e.g. Partial -> Replicate) before accumulation; a distributed gradient of a plain leaf
  /// (a plain tensor used with DTensors counts as replicated) becomes the plain full gradient.
  virtual Tensor grad_for_leaf(const Tensor& leaf, const Tensor& grad) = 0;
};
void set_distributed_dispatcher(DistributedDispatcher* d);
DistributedDispatcher* distributed_dispatcher();

/// Dispatches a call (no autograd): distributed dispatcher or local kernel.
std::vector<Tensor> dispatch(const OpCall& call);
/// dispatch() for single-output ops.
Tensor dispatch1(const OpCall& call);
/// Runs the local kernel of `call` on its (non-distributed) inputs; used by the dtensor layer.
std::vector<Tensor> run_kernel(const OpCall& call);

/// Registers `fn` as the kernel of `name` for device `dev` at load time.
#define DTR_REGISTER_KERNEL(name, dev, fn) \
  static const bool DTR_CONCAT(dtr_kernel_reg_, __LINE__) = (::dtr::register_kernel(name, dev, fn), true)
#define DTR_REGISTER_KERNEL_EXACT(name, dev, fn) \
  static const bool DTR_CONCAT(dtr_kernel_reg_, __LINE__) = (::dtr::register_kernel(name, dev, fn, false), true)
#define DTR_CONCAT_(a, b) a##b
#define DTR_CONCAT(a, b) DTR_CONCAT_(a, b)

}  // namespace dtr
