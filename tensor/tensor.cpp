#include "tensor/tensor.h"
#include "tensor/autograd/version_guard.h"

#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace dtr {

Shape contiguous_strides(const Shape& shape) {
  Shape s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return s;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  DTR_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " out of range for a ", ndim, "-d tensor (expected [", -n,
            ", ", n - 1, "])");
  return dim < 0 ? dim + n : dim;
}

Tensor empty(const Shape& shape, TensorOptions opt) {
  for (int64_t s : shape) DTR_CHECK(s >= 0, "empty: negative size in shape ", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opt.dtype;
  impl->device = opt.device;
  impl->storage = std::make_shared<StorageImpl>(static_cast<size_t>(shape_numel(shape)) * itemsize(opt.dtype), opt.device);
  Tensor t(std::move(impl));
  if (opt.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor make_view(const Tensor& base, const Shape& sizes, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->device = base.device();
  impl->version = base.impl()->version;
  return Tensor(std::move(impl));
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter) {
  auto impl = std::make_shared<TensorImpl>();
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->storage = std::make_shared<StorageImpl>(data, static_cast<size_t>(shape_numel(shape)) * itemsize(dtype),
                                                Device::cpu(), std::move(deleter));
  return Tensor(std::move(impl));
}

// ---- metadata ---------------------------------------------------------------------------------
const Shape& Tensor::sizes() const { return impl_->sizes; }
int64_t Tensor::size(int64_t d) const { return impl_->sizes[wrap_dim(d, dim(), "size")]; }
const Shape& Tensor::strides() const { return impl_->strides; }
int64_t Tensor::stride(int64_t d) const { return impl_->strides[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::dim() const { return static_cast<int64_t>(impl_->sizes.size()); }
int64_t Tensor::numel() const { return shape_numel(impl_->sizes); }
DType Tensor::dtype() const { return impl_->dtype; }
Device Tensor::device() const { return impl_->device; }
int64_t Tensor::storage_offset() const { return impl_->offset; }
const Storage& Tensor::storage() const { return impl_->storage; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = impl_->sizes.size(); i-- > 0;) {
    const int64_t s = impl_->sizes[i];
    if (s == 1) continue;
    if (s == 0) return true;
    if (impl_->strides[i] != expected) return false;
    expected *= s;
  }
  return true;
}

void* Tensor::data_ptr() const {
  DTR_CHECK(!is_distributed(), "data_ptr() on a distributed tensor (", impl_->dist->str(), "); use to_local()");
  if (!impl_->storage) return nullptr;
  if (impl_->storage->nbytes() == 0 && numel() > 0 && is_meta(*this)) meta_detail::data_of_meta(*this);
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * static_cast<int64_t>(itemsize(impl_->dtype));
}

// ---- autograd ---------------------------------------------------------------------------------
bool Tensor::requires_grad() const { return impl_->autograd && impl_->autograd->requires_grad; }

Tensor& Tensor::set_requires_grad(bool r) {
  DTR_CHECK(is_leaf(), "set_requires_grad: only leaves can change requires_grad (this tensor has grad_fn ",
            grad_fn()->name(), ")");
  DTR_CHECK(!r || is_floating(dtype()), "set_requires_grad: only floating tensors can require grad, got ", dtype());
  impl_->autograd_meta().requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const { return impl_->autograd ? impl_->autograd->grad : Tensor(); }
void Tensor::set_grad(const Tensor& g) const {
  DTR_CHECK(!g.defined() || g.sizes() == sizes(), "set_grad: gradient shape ", g.sizes(), " differs from tensor shape ",
            sizes());
  impl_->autograd_meta().grad = g;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> none;
  return impl_->autograd ? impl_->autograd->grad_fn : none;
}

bool Tensor::is_leaf() const { return grad_fn() == nullptr; }

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  DTR_CHECK(requires_grad(), "backward: tensor of shape ", sizes(), " does not require grad");
  Tensor g = grad;
  if (!g.defined()) {
    DTR_CHECK(numel() == 1, "backward: grad can be implicit only for 1-element outputs, got shape ", sizes());
    g = ones_like(*this);
  }
  DTR_CHECK(g.sizes() == sizes(), "backward: gradient shape ", g.sizes(), " differs from output shape ", sizes());
  run_backward({*this}, {g}, retain_graph);
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->sizes = impl_->sizes;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  impl->version = impl_->version;
  impl->dist = impl_->dist;
  return Tensor(std::move(impl));
}

void Tensor::register_hook(GradHook h) const {
  DTR_CHECK(requires_grad(), "register_hook on a tensor that does not require grad");
  if (is_leaf()) {
    impl_->autograd->hooks.push_back(std::move(h));
  } else {
    auto& node = impl_->autograd->grad_fn;
    node->output_hooks[impl_->autograd->output_nr].push_back(std::move(h));
  }
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook h) const {
  DTR_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_grad_hook: only leaves that require grad");
  impl_->autograd->post_acc_hooks.push_back(std::move(h));
}

void Tensor::retain_grad() const {
  DTR_CHECK(requires_grad(), "retain_grad on a tensor that does not require grad");
  if (is_leaf() || impl_->autograd->retains_grad) return;
  impl_->autograd->retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_;
  register_hook([weak](const Tensor& g) {
    if (auto p = weak.lock()) {
      AutogradMeta& m = p->autograd_meta();
      m.grad = m.grad.defined() ? add(m.grad, g) : g;
    }
    return Tensor();
  });
}

uint32_t Tensor::version() const { return impl_->version->load(); }
void Tensor::bump_version() const { impl_->version->fetch_add(1); }
UnsafePreserveVersionCounter::UnsafePreserveVersionCounter(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {
  for (const Tensor& t : tensors_) versions_.push_back(t.version());
}
UnsafePreserveVersionCounter::~UnsafePreserveVersionCounter() {
  for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].impl()->version->store(versions_[i]);
}

const std::string& Tensor::name() const { return impl_->name; }
void Tensor::set_name(const std::string& n) const { impl_->name = n; }

bool Tensor::is_distributed() const { return impl_->dist != nullptr; }
const std::shared_ptr<DistributedSpec>& Tensor::dist_spec() const { return impl_->dist; }

// ---- method forms -----------------------------------------------------------------------------
Tensor Tensor::view(const Shape& s) const { return dtr::view(*this, s); }
Tensor Tensor::reshape(const Shape& s) const { return dtr::reshape(*this, s); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return dtr::transpose(*this, a, b); }
Tensor Tensor::t() const {
  DTR_CHECK(dim() == 2, "t(): expected a 2-d tensor, got shape ", sizes());
  return dtr::transpose(*this, 0, 1);
}
Tensor Tensor::permute(const Shape& d) const { return dtr::permute(*this, d); }
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t l) const { return dtr::narrow(*this, d, s, l); }
Tensor Tensor::expand(const Shape& s) const { return dtr::expand(*this, s); }
Tensor Tensor::squeeze(int64_t d) const { return dtr::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return dtr::unsqueeze(*this, d); }
Tensor Tensor::flatten(int64_t s, int64_t e) const { return dtr::flatten(*this, s, e); }
Tensor Tensor::contiguous() const { return is_contiguous() && !is_distributed() ? *this : dtr::contiguous(*this); }
Tensor Tensor::to(DType dt) const { return dt == dtype() ? *this : to_dtype(*this, dt); }
Tensor Tensor::to(Device d) const { return d == device() ? *this : to_device(*this, d); }
Tensor Tensor::clone() const { return dtr::clone(*this); }

}  // namespace dtr
