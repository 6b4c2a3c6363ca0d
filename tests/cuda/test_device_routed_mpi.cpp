// DeviceRoutedProcessGroup (the groups of an NCCL mesh): CPU tensors go to its CPU backend, CUDA
// tensors to its CUDA one, every call is counted once on the routed group. Here both backends
// are MPI groups (so the CPU routing runs without a GPU); the CUDA case needs a device.
#include "cuda_test_util.h"
#include "runtime/device_routed_process_group.h"
#include "runtime/env.h"
#include "runtime/mpi_process_group.h"

using namespace dtr;

TEST_CASE("DeviceRoutedProcessGroup routes by the tensor's device and counts each call once", "[mpi]") {
  auto cpu = MpiProcessGroup::world("routed-cpu"), gpu = MpiProcessGroup::world("routed-gpu");
  DeviceRoutedProcessGroup pg(cpu, gpu);
  CHECK(pg.size() == world_size());
  CHECK(pg.rank() == rank());
  Tensor t = full({3}, static_cast<double>(rank() + 1), TensorOptions(DType::f64));
  pg.all_reduce(t)->wait();
  const double n = world_size();
  CHECK(t.to_vector<double>() == std::vector<double>(3, n * (n + 1) / 2));
  Tensor out = zeros({3 * world_size()}, TensorOptions(DType::f64));
  pg.all_gather(out, t)->wait();
  CHECK(pg.counters().count(CommKind::all_reduce) == 1);
  CHECK(pg.counters().nbytes(CommKind::all_reduce) == 24);
  CHECK(pg.counters().count(CommKind::all_gather) == 1);
  CHECK(cpu->counters().count(CommKind::all_reduce) == 1);  // the CPU backend served them
  CHECK(gpu->counters().count(CommKind::all_reduce) == 0);
  CHECK(gpu->counters().count(CommKind::all_gather) == 0);
  if (testing::cuda_available()) {
    Tensor c = full({2}, 1.0, TensorOptions(DType::f32).with_device(testing::cuda_device()));
    pg.all_reduce(c)->wait();
    CHECK(gpu->counters().count(CommKind::all_reduce) == 1);
    CHECK(c.to(Device::cpu()).to_vector<float>() == std::vector<float>(2, static_cast<float>(world_size())));
  }
}

TEST_CASE("DeviceRoutedProcessGroup refuses backends of different members", "[mpi]") {
  if (world_size() < 2) return;
  auto all = MpiProcessGroup::world("routed-all");
  auto self = MpiProcessGroup::split(rank(), 0, "routed-self{ranks}");
  CHECK_THROWS_WITH(DeviceRoutedProcessGroup(all, self), Catch::Contains("same members"));
}
