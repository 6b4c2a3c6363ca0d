#pragma once
// dtr::Tensor: a cheap handle to a shared TensorImpl (storage + sizes + strides + offset +
// dtype + autograd metadata + optional distributed spec). Semantics follow PyTorch's Tensor.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace dtr {

using Shape = std::vector<int64_t>;

struct TensorImpl;
struct Node;
class Tensor;

/// A gradient hook: receives the gradient, returns a replacement (or an undefined Tensor to
/// keep it). Source: torch.Tensor.register_hook.
using GradHook = std::function<Tensor(const Tensor&)>;
/// Runs after a leaf's .grad was accumulated. Source: torch.Tensor.register_post_accumulate_grad_hook.
using PostAccumulateGradHook = std::function<void(Tensor&)>;

/// Base of the distributed spec that the dtensor layer attaches to a TensorImpl. The tensor
/// layer only knows that it exists (dependency rule: tensor knows nothing of meshes).
struct DistributedSpec {
  virtual ~DistributedSpec() = default;
  /// Human-readable placements, e.g. "DTensor(mesh=[2], placements=[Shard(0)])".
  virtual std::string str() const = 0;
};

/// Creation options for factories (dtype f32 on CPU by default, like PyTorch).
struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}  // NOLINT: implicit, so zeros(shape, DType::f64) reads well
  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_requires_grad(bool r = true) const { auto o = *this; o.requires_grad = r; return o; }
};

/// A handle to a (possibly shared) TensorImpl. Copying a Tensor copies the handle, not the
/// data (like PyTorch). A default-constructed Tensor is undefined (`defined()` is false).
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  /// True when both handles point to the same impl.
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // ---- metadata --------------------------------------------------------------------------
  /// Global sizes (for a distributed tensor: the global shape, not the local shard's).
  const Shape& sizes() const;
  /// Size of dim `d` (negative counts from the end); throws on an out-of-range dim.
  int64_t size(int64_t d) const;
  const Shape& strides() const;
  int64_t stride(int64_t d) const;
  int64_t dim() const;
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  int64_t storage_offset() const;
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(dtype()); }
  const Storage& storage() const;

  /// Pointer to element 0 (storage base + offset). Throws for a distributed tensor.
  void* data_ptr() const;
  template <class T> T* data() const {
    DTR_CHECK(dtype_of<T>::value == dtype(), "data<", dtype_name(dtype_of<T>::value), ">() on a ", dtype(), " tensor");
    return static_cast<T*>(data_ptr());
  }
  /// The single value of a 1-element tensor, converted to T (any dtype / device).
  template <class T> T item() const;
  /// Copies all elements (in logical row-major order) to a vector, converting to T.
  template <class T> std::vector<T> to_vector() const;

  // ---- autograd -------------------------------------------------------------------------
  bool requires_grad() const;
  /// Sets requires_grad on a leaf. Returns *this. Throws on a non-leaf or an integer dtype.
  Tensor& set_requires_grad(bool r = true);
  /// The accumulated gradient of a leaf (undefined until backward reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  const std::shared_ptr<Node>& grad_fn() const;
  bool is_leaf() const;
  /// Runs backprop from this tensor. `grad` defaults to ones for a 1-element tensor; required
  /// otherwise. Throws when the tensor does not require grad.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  /// A tensor sharing data but cut from the graph (requires_grad false).
  Tensor detach() const;
  /// Registers a hook run on this tensor's gradient before it is used / accumulated.
  void register_hook(GradHook h) const;
  /// Leaves only: runs after .grad was accumulated (FSDP / DDP readiness signal).
  void register_post_accumulate_grad_hook(PostAccumulateGradHook h) const;
  /// Keeps .grad on a non-leaf tensor after backward.
  void retain_grad() const;
  /// Version counter, shared by all views of one storage; bumped by every in-place op.
  uint32_t version() const;
  void bump_version() const;
  /// Optional name used in messages and in module FQN bookkeeping.
  const std::string& name() const;
  void set_name(const std::string& n) const;

  // ---- distributed ----------------------------------------------------------------------
  bool is_distributed() const;
  const std::shared_ptr<DistributedSpec>& dist_spec() const;

  // ---- method forms of common ops (defined in ops/*.cpp) ---------------------------------
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;
  Tensor permute(const Shape& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor contiguous() const;
  Tensor to(DType dt) const;
  Tensor to(Device d) const;
  Tensor clone() const;
  /// Copies `src` (broadcast to this shape, any dtype) into this tensor in place.
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(double v);
  Tensor& zero_();

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// Autograd state of a tensor.
struct AutogradMeta {
  bool requires_grad = false;
  bool retains_grad = false;
  std::shared_ptr<Node> grad_fn;          // null for leaves
  uint32_t output_nr = 0;                 // which output of grad_fn this tensor is
  Tensor grad;                            // accumulated gradient (leaves, retain_grad)
  std::weak_ptr<Node> grad_accumulator;   // leaves: the AccumulateGrad node, created lazily
  std::vector<GradHook> hooks;            // leaf hooks (non-leaf hooks live on grad_fn)
  std::vector<PostAccumulateGradHook> post_acc_hooks;
};

/// The shared state behind a Tensor handle. For a distributed tensor, `dist` is set, sizes
/// are the global sizes and storage is empty: the local shard lives in the spec.
struct TensorImpl {
  Storage storage;
  Shape sizes;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  Device device;
  std::shared_ptr<std::atomic<uint32_t>> version = std::make_shared<std::atomic<uint32_t>>(0);
  std::unique_ptr<AutogradMeta> autograd;
  std::shared_ptr<DistributedSpec> dist;
  std::string name;

  AutogradMeta& autograd_meta() {
    if (!autograd) autograd = std::make_unique<AutogradMeta>();
    return *autograd;
  }
};

/// Row-major contiguous strides of `shape`.
Shape contiguous_strides(const Shape& shape);
/// Product of sizes (1 for a 0-d shape).
int64_t shape_numel(const Shape& shape);
/// Normalises a possibly negative dim against `ndim`; throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

/// A new tensor over a fresh contiguous storage (uninitialised data).
Tensor empty(const Shape& shape, TensorOptions opt = {});
/// A view of `base`'s storage with the given geometry; shares the version counter.
Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset);
/// Wraps external memory (not owned unless `deleter` frees it) as a CPU tensor.
Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter = {});
/// A CPU tensor holding a copy of `values` with the given shape (numel must match).
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opt = TensorOptions(dtype_of<T>::value));

}  // namespace dtr

#include "tensor/tensor_inl.h"
