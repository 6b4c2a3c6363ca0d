#pragma once
// DeviceMesh: an n-d grid of ranks with named dims, row-major (last dim fastest), one
// ProcessGroup per dim created collectively at construction. Source: PyTorch DeviceMesh.
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/process_group.h"

namespace dtr {

/// The collective backend of a mesh on `device`: "nccl" or "mpi". Env DTR_BACKEND=mpi|nccl
/// chooses; unset: "nccl" for CUDA meshes in CUDA builds when every local rank has its own
/// GPU (local_size <= device count), else "mpi" (CUDA tensors staged through pinned host
/// memory, e.g. several ranks sharing one GPU). CPU meshes always use MPI. The groups of an
/// "nccl" mesh are DeviceRoutedProcessGroups: NCCL for CUDA tensors, MPI for CPU tensors.
/// Errors: another DTR_BACKEND value; nccl without a CUDA device or without the CUDA build.
std::string collective_backend(Device device);

class DeviceMesh {
 public:
  /// A mesh over all world ranks 0..world-1 with the given sizes and dim names. Collective:
  /// every rank must construct it with the same arguments.
  /// Errors: product(sizes) != world size; duplicate names; sizes.size() != names.size().
  DeviceMesh(const Shape& sizes, const std::vector<std::string>& names, Device device = Device::cpu());
  /// A 1-d mesh over the world named `name`.
  static DeviceMesh world(const std::string& name = "world", Device device = Device::cpu());

  int ndim() const;
  /// Total number of ranks.
  int64_t size() const;
  int64_t size(int dim) const;
  int64_t size(const std::string& name) const;
  const Shape& shape() const;
  const std::vector<std::string>& dim_names() const;
  int dim_index(const std::string& name) const;
  /// Coordinate of this rank along each dim.
  std::vector<int64_t> get_coordinate() const;
  int64_t coordinate(int dim) const;
  /// The process group of a dim (the peers differing only along that dim).
  const std::shared_ptr<ProcessGroup>& group(int dim) const;
  const std::shared_ptr<ProcessGroup>& group(const std::string& name) const;
  /// Global ranks of the whole mesh in row-major order.
  const std::vector<int>& ranks() const;
  Device device() const;
  /// The sub-mesh over the named dims (this rank's slice); shares process groups.
  DeviceMesh operator[](const std::string& name) const;
  DeviceMesh operator[](const std::vector<std::string>& names) const;
  /// mesh[{"dp_replicate", "dp_shard"}] (a braced pair of literals would otherwise also match
  /// std::string's iterator-pair constructor).
  DeviceMesh operator[](std::initializer_list<std::string> names) const {
    return (*this)[std::vector<std::string>(names)];
  }
  /// Registers a flattened dim `new_name` = product of `names` (adjacent, in order), with its
  /// own process group (collective). Afterwards mesh[new_name] works.
  DeviceMesh& flatten(const std::vector<std::string>& names, const std::string& new_name);
  /// The whole mesh this one was derived from (by operator[]), every dim of the constructed
  /// mesh; its flattened dims are reachable through operator[] too.
  DeviceMesh root_mesh() const;
  /// True when both meshes were derived from the same constructed mesh (PyTorch's
  /// _mesh_resources.get_root_mesh(a) == get_root_mesh(b)).
  bool shares_root(const DeviceMesh& o) const;
  bool operator==(const DeviceMesh& o) const;
  bool operator!=(const DeviceMesh& o) const { return !(*this == o); }
  std::string str() const;

 private:
  struct State;
  std::shared_ptr<State> s_;
  DeviceMesh() = default;
};

}  // namespace dtr
