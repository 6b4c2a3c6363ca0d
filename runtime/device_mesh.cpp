#include "runtime/device_mesh.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "runtime/env.h"
#include "runtime/mpi_process_group.h"
#include "tensor/env_vars.h"
#include "tensor/error.h"
#ifdef DTR_WITH_CUDA
#include "runtime/device_routed_process_group.h"
#include "runtime/nccl_process_group.h"
#include "tensor/cuda/cuda_context.h"
#endif

namespace dtr {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

/// Linear (row-major) index of `coord` restricted to `dims` of a grid of `shape`.
int64_t linear(const Shape& shape, const std::vector<int64_t>& coord, const std::vector<int>& dims) {
  int64_t idx = 0;
  for (int d : dims) idx = idx * shape[d] + coord[d];
  return idx;
}

/// A process group over the ranks whose root coordinates differ only along `dims`.
/// Collective over the world (MPI_Comm_split).
std::shared_ptr<ProcessGroup> make_group(const Shape& shape, const std::vector<int64_t>& coord,
                                         const std::vector<int>& dims, const std::string& name, Device device) {
  std::vector<int> others;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) others.push_back(d);
  const int color = static_cast<int>(linear(shape, coord, others));
  const int key = static_cast<int>(linear(shape, coord, dims));
#ifdef DTR_WITH_CUDA
  // NCCL for CUDA tensors, MPI for the host tensors exchanged beside them (both collective, in
  // this order on every rank).
  if (collective_backend(device) == "nccl") {
    auto nccl = NcclProcessGroup::split(color, key, name + "{ranks}");
    return std::make_shared<DeviceRoutedProcessGroup>(MpiProcessGroup::split(color, key, name + "{ranks}"), nccl);
  }
#endif
  return MpiProcessGroup::split(color, key, name + "{ranks}");
}

}  // namespace

std::string collective_backend(Device device) {
  const std::string want = env::choice("DTR_BACKEND");
  if (!device.is_cuda() || want == "mpi") return "mpi";
#ifdef DTR_WITH_CUDA
  const int ndev = cuda::device_count();
  if (want == "nccl") {
    DTR_CHECK(ndev > 0, "DTR_BACKEND=nccl: no CUDA device visible to rank ", dtr::rank());
    return "nccl";
  }
  // Default: NCCL when every rank of the node has a GPU of its own (NCCL rejects two ranks on
  // one GPU), else MPI with CUDA tensors staged through pinned host memory.
  return ndev > 0 && dtr::local_size() <= ndev ? "nccl" : "mpi";
#else
  DTR_CHECK(want != "nccl", "DTR_BACKEND=nccl: dtr was built without CUDA (-DDTR_CUDA=ON)");
  return "mpi";
#endif
}

struct DeviceMesh::State {
  /// What every mesh derived from one constructed mesh shares: its grid, groups, flattened dims.
  struct Root {
    Shape shape;
    std::vector<std::string> names;
    std::vector<int64_t> coord;  // this rank's coordinate
    std::vector<std::shared_ptr<ProcessGroup>> groups;
    struct Flat {
      std::vector<int> dims;
      std::shared_ptr<ProcessGroup> group;
    };
    std::map<std::string, Flat> flat;
    Device device;
  };
  std::shared_ptr<Root> root;
  Shape shape;
  std::vector<std::string> names;
  std::vector<std::vector<int>> dims;  // root dims covered by each mesh dim (ascending)
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  std::vector<int> ranks;
  std::vector<int64_t> coord;

  /// Fills shape / ranks / coord from dims (this rank's slice of the root grid).
  void finish() {
    std::vector<int> covered;
    for (const auto& ds : dims) covered.insert(covered.end(), ds.begin(), ds.end());
    shape.clear();
    coord.clear();
    for (const auto& ds : dims) {
      int64_t n = 1;
      for (int d : ds) n *= root->shape[d];
      shape.push_back(n);
      coord.push_back(linear(root->shape, root->coord, ds));
    }
    // Enumerate the covered coordinates row-major, other coordinates fixed to this rank's.
    ranks.clear();
    std::vector<int64_t> c = root->coord;
    for (int d : covered) c[d] = 0;
    std::vector<int> all(root->shape.size());
    for (size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int>(d);
    for (;;) {
      ranks.push_back(static_cast<int>(linear(root->shape, c, all)));
      int k = static_cast<int>(covered.size()) - 1;
      while (k >= 0 && ++c[covered[k]] == root->shape[covered[k]]) c[covered[k--]] = 0;
      if (k < 0) break;
    }
  }
};

DeviceMesh::DeviceMesh(const Shape& sizes, const std::vector<std::string>& names, Device device) {
  const int world = dtr::world_size();
  std::ostringstream what;
  what << "DeviceMesh(sizes " << sizes << ", names (" << join(names) << "))";
  DTR_CHECK(!sizes.empty(), what.str(), ": needs at least one dim");
  DTR_CHECK(sizes.size() == names.size(), what.str(), ": ", sizes.size(), " sizes but ", names.size(), " names");
  int64_t prod = 1;
  for (int64_t s : sizes) {
    DTR_CHECK(s >= 1, what.str(), ": sizes must be >= 1");
    DTR_CHECK(!__builtin_mul_overflow(prod, s, &prod), what.str(), ": the product of the sizes overflows int64 (world size ",
              world, ")");
  }
  DTR_CHECK(prod == world, what.str(), ": the product of the sizes is ", prod, " but the world size is ", world);
  std::set<std::string> seen;
  for (const auto& n : names) {
    DTR_CHECK(!n.empty(), what.str(), ": empty dim name");
    DTR_CHECK(seen.insert(n).second, what.str(), ": duplicate dim name '", n, "'");
  }
  auto root = std::make_shared<State::Root>();
  root->shape = sizes;
  root->names = names;
  root->device = device;
  int64_t r = dtr::rank();
  root->coord.assign(sizes.size(), 0);
  for (size_t d = sizes.size(); d-- > 0;) {
    root->coord[d] = r % sizes[d];
    r /= sizes[d];
  }
  for (int d = 0; d < static_cast<int>(sizes.size()); ++d)
    root->groups.push_back(make_group(sizes, root->coord, {d}, names[d], device));
  s_ = std::make_shared<State>();
  s_->root = root;
  s_->names = names;
  for (int d = 0; d < static_cast<int>(sizes.size()); ++d) {
    s_->dims.push_back({d});
    s_->groups.push_back(root->groups[d]);
  }
  s_->finish();
}

DeviceMesh DeviceMesh::world(const std::string& name, Device device) {
  return DeviceMesh({dtr::world_size()}, {name}, device);
}

int DeviceMesh::ndim() const { return static_cast<int>(s_->shape.size()); }
int64_t DeviceMesh::size() const { return static_cast<int64_t>(s_->ranks.size()); }
int64_t DeviceMesh::size(int dim) const { return s_->shape[dim < 0 ? dim + ndim() : dim]; }
int64_t DeviceMesh::size(const std::string& name) const { return s_->shape[dim_index(name)]; }
const Shape& DeviceMesh::shape() const { return s_->shape; }
const std::vector<std::string>& DeviceMesh::dim_names() const { return s_->names; }
int DeviceMesh::dim_index(const std::string& name) const {
  auto it = std::find(s_->names.begin(), s_->names.end(), name);
  DTR_CHECK(it != s_->names.end(), "DeviceMesh: unknown dim name '", name, "'; dims are (", join(s_->names), ")");
  return static_cast<int>(it - s_->names.begin());
}
std::vector<int64_t> DeviceMesh::get_coordinate() const { return s_->coord; }
int64_t DeviceMesh::coordinate(int dim) const { return s_->coord[dim < 0 ? dim + ndim() : dim]; }
const std::shared_ptr<ProcessGroup>& DeviceMesh::group(int dim) const {
  DTR_CHECK(dim >= -ndim() && dim < ndim(), "DeviceMesh::group: dim ", dim, " out of range for ", str());
  return s_->groups[dim < 0 ? dim + ndim() : dim];
}
const std::shared_ptr<ProcessGroup>& DeviceMesh::group(const std::string& name) const {
  return s_->groups[dim_index(name)];
}
const std::vector<int>& DeviceMesh::ranks() const { return s_->ranks; }
Device DeviceMesh::device() const { return s_->root->device; }

DeviceMesh DeviceMesh::operator[](const std::string& name) const { return (*this)[std::vector<std::string>{name}]; }

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& names) const {
  DTR_CHECK(!names.empty(), "DeviceMesh[]: no dim names given for ", str());
  std::set<int> mine;
  for (const auto& ds : s_->dims) mine.insert(ds.begin(), ds.end());
  auto out = std::make_shared<State>();
  out->root = s_->root;
  std::set<std::string> seen;
  int last = -1;
  for (const auto& n : names) {
    DTR_CHECK(seen.insert(n).second, "DeviceMesh[(", join(names), ")]: duplicate dim name '", n, "'");
    std::vector<int> ds;
    std::shared_ptr<ProcessGroup> g;
    auto it = std::find(s_->names.begin(), s_->names.end(), n);
    if (it != s_->names.end()) {
      ds = s_->dims[it - s_->names.begin()];
      g = s_->groups[it - s_->names.begin()];
    } else if (auto f = s_->root->flat.find(n); f != s_->root->flat.end() &&
               std::all_of(f->second.dims.begin(), f->second.dims.end(), [&](int d) { return mine.count(d) > 0; })) {
      ds = f->second.dims;
      g = f->second.group;
    } else {
      std::string flat;
      for (const auto& [k, v] : s_->root->flat) flat += ", " + k;
      DTR_ERROR("DeviceMesh[(", join(names), ")]: unknown dim name '", n, "'; dims are (", join(s_->names), flat,
                ")");
    }
    DTR_CHECK(ds.front() > last, "DeviceMesh[(", join(names), ")]: dims must be given in mesh order without overlap (",
              str(), ")");
    last = ds.back();
    out->names.push_back(n);
    out->dims.push_back(ds);
    out->groups.push_back(g);
  }
  out->finish();
  DeviceMesh m;
  m.s_ = out;
  return m;
}

DeviceMesh& DeviceMesh::flatten(const std::vector<std::string>& names, const std::string& new_name) {
  const std::string what = "DeviceMesh::flatten((" + join(names) + ") -> '" + new_name + "')";
  DTR_CHECK(!names.empty() && !new_name.empty(), what, ": needs dim names and a new name");
  std::vector<int> ds;
  int prev = -1;
  for (const auto& n : names) {
    const int i = dim_index(n);
    DTR_CHECK(prev < 0 || i == prev + 1, what, ": dims must be adjacent and in mesh order in ", str());
    prev = i;
    ds.insert(ds.end(), s_->dims[i].begin(), s_->dims[i].end());
  }
  auto& root = *s_->root;
  DTR_CHECK(std::find(root.names.begin(), root.names.end(), new_name) == root.names.end(), what, ": '", new_name,
            "' is already a mesh dim");
  if (auto f = root.flat.find(new_name); f != root.flat.end()) {
    DTR_CHECK(f->second.dims == ds, what, ": '", new_name, "' already names a different flattened dim");
    return *this;
  }
  if (ds.size() == 1) {
    root.flat[new_name] = {ds, root.groups[ds[0]]};
  } else {
    root.flat[new_name] = {ds, make_group(root.shape, root.coord, ds, new_name, root.device)};
  }
  return *this;
}

DeviceMesh DeviceMesh::root_mesh() const {
  auto out = std::make_shared<State>();
  out->root = s_->root;
  out->names = s_->root->names;
  for (size_t d = 0; d < out->names.size(); ++d) {
    out->dims.push_back({static_cast<int>(d)});
    out->groups.push_back(s_->root->groups[d]);
  }
  out->finish();
  DeviceMesh m;
  m.s_ = out;
  return m;
}

bool DeviceMesh::shares_root(const DeviceMesh& o) const { return s_->root == o.s_->root; }

bool DeviceMesh::operator==(const DeviceMesh& o) const {
  return s_ == o.s_ || (s_->shape == o.s_->shape && s_->names == o.s_->names && s_->ranks == o.s_->ranks &&
                        s_->root->device == o.s_->root->device);
}

std::string DeviceMesh::str() const {
  std::ostringstream os;
  os << "DeviceMesh(" << s_->root->device << ", shape " << s_->shape << ", names (" << join(s_->names) << "), ranks [";
  for (size_t i = 0; i < s_->ranks.size(); ++i) os << (i ? ", " : "") << s_->ranks[i];
  os << "])";
  return os.str();
}

}  // namespace dtr
