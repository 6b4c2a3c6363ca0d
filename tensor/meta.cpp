// Meta tensors and their recipes (see meta.h).
#include "tensor/meta.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr {
namespace {

thread_local bool t_meta_init = false;

/// What a meta tensor stands for: the block at `offset` of a global tensor `global`.
struct Deferred {
  std::shared_ptr<const InitSource> source;
  Shape global, offset;
};

/// Meta tensors are ordinary tensors over a 0-byte storage; their recipe is kept here, keyed by
/// the storage (shared by detached handles and tied names), so that no TensorImpl / StorageImpl
/// field is needed. Entries die with their storage (weak_ptr) and are pruned as the map grows.
struct Registry {
  std::mutex mu;
  std::map<const StorageImpl*, std::pair<std::weak_ptr<StorageImpl>, std::shared_ptr<Deferred>>> map;
  size_t prune_at = 1024;
};
Registry& registry() {
  static Registry r;
  return r;
}

std::shared_ptr<Deferred> find(const Tensor& t) {
  if (!t.defined() || t.is_distributed() || !t.storage() || t.storage()->nbytes() != 0 || t.numel() == 0)
    return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.map.find(t.storage().get());
  if (it == r.map.end()) return nullptr;
  if (it->second.first.lock().get() != t.storage().get()) {
    r.map.erase(it);
    return nullptr;
  }
  return it->second.second;
}

void put(const Storage& s, std::shared_ptr<Deferred> d) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.map.size() >= r.prune_at) {
    for (auto it = r.map.begin(); it != r.map.end();) it = it->second.first.expired() ? r.map.erase(it) : std::next(it);
    r.prune_at = std::max<size_t>(1024, 2 * r.map.size());
  }
  r.map[s.get()] = {s, std::move(d)};
}

void erase(const Storage& s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.map.erase(s.get());
}

std::shared_ptr<Deferred> require(const Tensor& t, const char* op) {
  auto d = find(t);
  DTR_CHECK(d != nullptr, op, ": not a meta tensor (", t.sizes(), " ", t.dtype(), ")");
  return d;
}

class ConstantInit final : public InitSource {
 public:
  explicit ConstantInit(double v) : v_(v) {}
  void fill(const Shape&, const Shape&, Tensor& out) const override { out.fill_(v_); }
  std::string str() const override {
    std::ostringstream o;
    o << "constant(" << v_ << ")";
    return o.str();
  }

 private:
  double v_;
};

/// Philox-addressed values: element with global row-major index i is f(seed, offset + i),
/// computed in f64 and cast to the tensor's dtype as the eager factories do (random_fill).
class PhiloxInit final : public InitSource {
 public:
  PhiloxInit(bool normal, double a, double b, uint64_t seed, uint64_t offset)
      : normal_(normal), a_(a), b_(b), seed_(seed), offset_(offset) {}

  void fill(const Shape& global, const Shape& offset, Tensor& out) const override {
    NoGradGuard ng;
    const Shape gs = contiguous_strides(global);
    const Shape& sz = out.sizes();
    const int64_t nd = static_cast<int64_t>(sz.size());
    const int64_t last = nd == 0 ? 1 : sz[nd - 1];
    const int64_t rows = last == 0 ? 0 : out.numel() / last;
    if (rows == 0) return;
    // Rows of the last dim in chunks of about 64K values, so the f64 scratch stays small (512 KiB).
    const int64_t chunk = out.is_contiguous() ? std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, last)) : rows;
    Tensor flat = out.is_contiguous() ? out.view({rows, last}) : out;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t nr = std::min(chunk, rows - r0);
      Tensor tmp = empty({nr, last}, TensorOptions(DType::f64));
      double* p = tmp.data<double>();
#pragma omp parallel for schedule(static) if (nr * last >= 65536)
      for (int64_t r = 0; r < nr; ++r) {
        // Global index of the row's first element: unravel the row over the leading dims.
        int64_t rem = r0 + r, base = 0;
        for (int64_t d = nd - 2; d >= 0; --d) {
          base += (offset[d] + rem % sz[d]) * gs[d];
          rem /= sz[d];
        }
        if (nd > 0) base += offset[nd - 1] * gs[nd - 1];
        for (int64_t j = 0; j < last; ++j) {
          const uint64_t i = offset_ + static_cast<uint64_t>(base + j);
          p[r * last + j] = normal_ ? a_ + b_ * philox_normal(seed_, i) : a_ + (b_ - a_) * philox_uniform(seed_, i);
        }
      }
      Tensor vals = tmp.to(out.dtype());
      if (out.is_contiguous()) {
        Tensor dst = flat.narrow(0, r0, nr);
        dst.copy_(vals);
      } else {
        out.copy_(vals.view(sz));
      }
    }
  }

  std::string str() const override {
    std::ostringstream o;
    o << (normal_ ? "normal(" : "uniform(") << a_ << ", " << b_ << ") seed " << seed_ << " offset " << offset_;
    return o.str();
  }

 private:
  bool normal_;
  double a_, b_;
  uint64_t seed_, offset_;
};

}  // namespace

std::shared_ptr<const InitSource> constant_init(double value) { return std::make_shared<ConstantInit>(value); }
std::shared_ptr<const InitSource> uniform_init(double low, double high, uint64_t seed, uint64_t offset) {
  return std::make_shared<PhiloxInit>(false, low, high, seed, offset);
}
std::shared_ptr<const InitSource> normal_init(double mean, double std, uint64_t seed, uint64_t offset) {
  return std::make_shared<PhiloxInit>(true, mean, std, seed, offset);
}

MetaInitGuard::MetaInitGuard(bool enabled) : prev_(t_meta_init) { t_meta_init = enabled; }
MetaInitGuard::~MetaInitGuard() { t_meta_init = prev_; }
bool meta_init_enabled() { return t_meta_init; }

Tensor meta_tensor(const Shape& shape, DType dtype, Device device, std::shared_ptr<const InitSource> source,
                   Shape global, Shape offset) {
  DTR_CHECK(source != nullptr, "meta_tensor: no init source");
  for (int64_t s : shape) DTR_CHECK(s >= 0, "meta_tensor: negative size in shape ", shape);
  if (global.empty()) global = shape;
  if (offset.empty()) offset.assign(shape.size(), 0);
  DTR_CHECK(global.size() == shape.size() && offset.size() == shape.size(), "meta_tensor: block ", shape, " at ",
            offset, " of a tensor of shape ", global, " (dims differ)");
  for (size_t d = 0; d < shape.size(); ++d)
    DTR_CHECK(offset[d] >= 0 && offset[d] + shape[d] <= global[d], "meta_tensor: block ", shape, " at ", offset,
              " lies outside the tensor of shape ", global);
  auto impl = std::make_shared<TensorImpl>();
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  impl->storage = std::make_shared<StorageImpl>(0, device);
  Tensor t(std::move(impl));
  if (t.numel() > 0) put(t.storage(), std::make_shared<Deferred>(Deferred{std::move(source), global, offset}));
  return t;
}

bool is_meta(const Tensor& t) { return find(t) != nullptr; }

void set_init_source(const Tensor& t, std::shared_ptr<const InitSource> source) {
  DTR_CHECK(source != nullptr, "set_init_source: no source");
  auto d = require(t, "set_init_source");
  put(t.storage(), std::make_shared<Deferred>(Deferred{std::move(source), d->global, d->offset}));
}

std::string init_source_str(const Tensor& t) { return require(t, "init_source_str")->source->str(); }

Tensor meta_block(const Tensor& t, const Shape& offset, const Shape& shape) {
  auto d = require(t, "meta_block");
  DTR_CHECK(offset.size() == shape.size() && shape.size() == t.sizes().size(), "meta_block: block ", shape, " at ",
            offset, " of a tensor of shape ", t.sizes());
  Shape off = d->offset;
  for (size_t i = 0; i < shape.size(); ++i) {
    DTR_CHECK(offset[i] >= 0 && offset[i] + shape[i] <= t.sizes()[i], "meta_block: block ", shape, " at ", offset,
              " lies outside the tensor of shape ", t.sizes());
    off[i] += offset[i];
  }
  if (shape_numel(shape) == 0) return empty(shape, TensorOptions(t.dtype()).with_device(t.device()));
  return meta_tensor(shape, t.dtype(), t.device(), d->source, d->global, off);
}

Tensor meta_to_device(const Tensor& t, Device device) {
  auto d = require(t, "meta_to_device");
  return meta_tensor(t.sizes(), t.dtype(), device, d->source, d->global, d->offset);
}

void fill_from_meta(const Tensor& t, const Shape& offset, Tensor& out) {
  if (out.numel() == 0) return;
  auto d = require(t, "fill_from_meta");
  DTR_CHECK(offset.size() == t.sizes().size() && out.sizes().size() == offset.size(), "fill_from_meta: block ",
            out.sizes(), " at ", offset, " of a tensor of shape ", t.sizes());
  Shape off = d->offset;
  for (size_t i = 0; i < offset.size(); ++i) {
    DTR_CHECK(offset[i] >= 0 && offset[i] + out.sizes()[i] <= t.sizes()[i], "fill_from_meta: block ", out.sizes(),
              " at ", offset, " lies outside the tensor of shape ", t.sizes());
    off[i] += offset[i];
  }
  NoGradGuard ng;
  d->source->fill(d->global, off, out);
}

void materialize_(const Tensor& t) {
  auto d = require(t, "materialize_");
  DTR_CHECK(t.is_contiguous() && t.storage_offset() == 0, "materialize_: a meta view (", t.sizes(),
            ") cannot be materialised; materialise its base");
  const Storage s = t.storage();
  erase(s);
  s->resize_(static_cast<size_t>(t.numel()) * itemsize(t.dtype()));
  NoGradGuard ng;
  Tensor out = t.detach();
  d->source->fill(d->global, d->offset, out);
}

namespace meta_detail {

void copy_into_meta(const Tensor& dst, const Tensor& src) {
  DTR_CHECK(is_meta(src), "copy_ into a meta tensor ", dst.sizes(), ": the source must be meta too (a factory under "
            "MetaInitGuard), got a tensor with data");
  DTR_CHECK(src.sizes() == dst.sizes(), "copy_ into a meta tensor: shapes differ, ", dst.sizes(), " vs ", src.sizes());
  auto d = find(src);
  put(dst.storage(), std::make_shared<Deferred>(*d));
}

void fill_meta(const Tensor& dst, double value) {
  auto d = require(dst, "fill_");
  put(dst.storage(), std::make_shared<Deferred>(Deferred{constant_init(value), d->global, d->offset}));
}

void data_of_meta(const Tensor& t) {
  DTR_ERROR("data of a meta tensor ", t.sizes(), " ", t.dtype(), " (", init_source_str(t),
            ") was read: materialise it first (materialize_ / parallelize_model)");
}

}  // namespace meta_detail
}  // namespace dtr
