#include "dtensor/spec.h"

#include <sstream>

namespace dtr {

Shape DTensorSpec::local_shape() const {
  Shape ls, off;
  local_shape_and_offset(shape, mesh.shape(), placements, mesh.get_coordinate(), ls, off);
  return ls;
}

Shape DTensorSpec::local_offset() const {
  Shape ls, off;
  local_shape_and_offset(shape, mesh.shape(), placements, mesh.get_coordinate(), ls, off);
  return off;
}

bool DTensorSpec::has_partial() const {
  for (const auto& p : placements)
    if (p.is_partial()) return true;
  return false;
}

int64_t DTensorSpec::num_shards(int64_t d) const {
  int64_t n = 1;
  for (size_t i = 0; i < placements.size(); ++i)
    if (placements[i].shards() && placements[i].dim == d) n *= mesh.size(static_cast<int>(i));
  return n;
}

bool DTensorSpec::operator==(const DTensorSpec& o) const {
  return mesh == o.mesh && placements == o.placements && shape == o.shape && dtype == o.dtype;
}

std::string DTensorSpec::str() const {
  std::ostringstream os;
  os << "DTensor(shape=" << shape << ", dtype=" << dtype << ", mesh=" << mesh.str()
     << ", placements=" << placements_str(placements) << ")";
  return os.str();
}

Tensor make_dtensor(const Tensor& local, const DTensorSpec& spec, bool check) {
  DTR_CHECK(!local.is_distributed(), "make_dtensor: the local tensor is already distributed");
  DTR_CHECK(spec.placements.size() == static_cast<size_t>(spec.mesh.ndim()), "make_dtensor: ",
            spec.placements.size(), " placements for a ", spec.mesh.ndim(), "-d mesh");
  if (check) {
    const Shape ls = spec.local_shape();
    DTR_CHECK(local.sizes() == ls, "make_dtensor: local shard ", local.sizes(), " does not match ", ls,
              " expected for ", spec.str());
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->sizes = spec.shape;
  impl->strides = contiguous_strides(spec.shape);
  impl->dtype = local.dtype();
  impl->device = local.device();
  auto st = std::make_shared<DTensorState>(spec, local);
  st->spec.dtype = local.dtype();
  impl->dist = std::move(st);
  return Tensor(std::move(impl));
}

const DTensorSpec& dtensor_spec(const Tensor& t, const char* op) {
  DTR_CHECK(t.defined() && t.is_distributed(), op, ": expected a distributed tensor, got a plain tensor of shape ",
            t.defined() ? t.sizes() : Shape{});
  return static_cast<const DTensorState*>(t.dist_spec().get())->spec;
}

const Tensor& local_tensor(const Tensor& t) {
  DTR_CHECK(t.defined() && t.is_distributed(), "to_local: expected a distributed tensor");
  return static_cast<const DTensorState*>(t.dist_spec().get())->local;
}

}  // namespace dtr
