// Collectives on CUDA tensors (2 ranks): the MPI group staged through pinned host memory
// (works with any number of ranks per GPU), NCCL when every rank has a GPU of its own, and the
// backend choice of DeviceMesh (DTR_BACKEND).
#include <cstdlib>

#include "cuda_test_util.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "runtime/mpi_process_group.h"
#include "tensor/cuda/cuda_context.h"
#ifdef DTR_WITH_CUDA
#include "runtime/nccl_process_group.h"
#endif

using namespace dtr;

namespace {

/// Element i of rank r: small integers, exact in every dtype and in their sums.
Tensor rank_data(const Shape& shape, DType dt, int r) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((static_cast<int64_t>(i) * 3 + r * 5) % 7) - 3.0;
  return from_vector<double>(v, shape).to(dt);
}

/// The sum over all ranks of rank_data, computed locally.
Tensor expected_sum(const Shape& shape, DType dt, int world) {
  Tensor acc = zeros(shape, TensorOptions(DType::f64));
  for (int r = 0; r < world; ++r) acc = add(acc, rank_data(shape, DType::f64, r));
  return acc.to(dt);
}

void check_collectives(ProcessGroup& pg, const Device dev) {
  const int world = pg.size(), me = pg.rank();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i64}) {
    INFO(pg.name() << " " << dtype_name(dt));
    // all_reduce, contiguous
    Tensor t = rank_data({5, 6}, dt, me).to(dev);
    pg.all_reduce(t)->wait();
    CHECK(t.device() == dev);
    CHECK(t.to_vector<double>() == expected_sum({5, 6}, dt, world).to_vector<double>());
    // all_gather into one tensor
    Tensor in = rank_data({3, 4}, dt, me).to(dev);
    Tensor out = zeros({3 * world, 4}, TensorOptions(dt).with_device(dev));
    pg.all_gather(out, in)->wait();
    std::vector<Tensor> parts;
    for (int r = 0; r < world; ++r) parts.push_back(rank_data({3, 4}, dt, r));
    CHECK(out.to_vector<double>() == cat(parts, 0).to_vector<double>());
    // reduce_scatter
    Tensor rs_in = rank_data({2 * world, 3}, dt, me).to(dev);
    Tensor rs_out = zeros({2, 3}, TensorOptions(dt).with_device(dev));
    pg.reduce_scatter(rs_out, rs_in)->wait();
    CHECK(rs_out.to_vector<double>() == expected_sum({2 * world, 3}, dt, world).narrow(0, 2 * me, 2).to_vector<double>());
  }
}

}  // namespace

TEST_CASE("collectives: backend choice (DTR_BACKEND)", "[cuda][mpi]") {
  CHECK(collective_backend(Device::cpu()) == "mpi");
  setenv("DTR_BACKEND", "mpi", 1);
  CHECK(collective_backend(Device::cuda(0)) == "mpi");
  setenv("DTR_BACKEND", "gloo", 1);
  CHECK_THROWS_WITH(collective_backend(Device::cuda(0)), Catch::Matchers::Contains("expected mpi or nccl"));
  unsetenv("DTR_BACKEND");
  if (!testing::cuda_available()) {
    CHECK(collective_backend(Device::cuda(0)) == "mpi");
    CHECK(cuda_device() == -1);
  } else {
    CHECK(cuda_device() == local_rank() % cuda::device_count());
    CHECK(cuda::current_device() == cuda_device());
  }
}

TEST_CASE("collectives: CUDA tensors on the MPI group (staged through pinned memory)", "[cuda][mpi]") {
  DTR_REQUIRE_CUDA();
  auto pg = MpiProcessGroup::world("mpi-cuda");
  const Device dev = testing::cuda_device();
  check_collectives(*pg, dev);
  // A non-contiguous CUDA tensor: reduced in place through the staging buffer.
  Tensor base = rank_data({6, 4}, DType::f32, pg->rank()).to(dev);
  Tensor view = base.t();
  pg->all_reduce(view)->wait();
  CHECK(base.to_vector<double>() == expected_sum({6, 4}, DType::f32, pg->size()).to_vector<double>());
}

TEST_CASE("collectives: CUDA tensors on NCCL (one GPU per rank) and a CUDA DeviceMesh", "[cuda][mpi]") {
  DTR_REQUIRE_CUDA();
  if (collective_backend(testing::cuda_device()) != "nccl") {
    WARN("ranks share a GPU: NCCL not tested (the MPI group serves CUDA tensors here)");
    DeviceMesh mesh({world_size()}, {"dp"}, testing::cuda_device());
    check_collectives(*mesh.group("dp"), testing::cuda_device());
    return;
  }
#ifdef DTR_WITH_CUDA
  auto pg = NcclProcessGroup::world("nccl");
  check_collectives(*pg, testing::cuda_device());
  DeviceMesh mesh({world_size()}, {"dp"}, testing::cuda_device());
  check_collectives(*mesh.group("dp"), testing::cuda_device());
#endif
}
