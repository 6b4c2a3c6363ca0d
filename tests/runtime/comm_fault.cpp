// Fault helper for comm_fault.sh: rank 1 dies (mode "die") or hangs (mode "hang") before an
// all_reduce; the other ranks wait on it. The job must end on its own: Open MPI aborts the job
// when a rank dies, and Work::wait's timeout (DTR_COMM_TIMEOUT_S) aborts it when a rank hangs.
// Raw blocking MPI calls outside a process group must be bounded too: "max" (rank 1 stopped
// with SIGSTOP, the others in all_ranks_max, the world MPI_Allreduce behind control decisions)
// and "split" (rank 1 hangs, the others create a communicator: a DeviceMesh's MPI_Comm_split).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "runtime/mpi_process_group.h"
#include "tensor/ops.h"

int main(int argc, char** argv) {
  dtr::init(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "die";
  auto pg = dtr::MpiProcessGroup::world("world");
  dtr::Tensor t = dtr::ones({1024});
  pg->all_reduce(t)->wait();  // everyone alive here
  if (pg->rank() == 1) {
    if (mode == "die") std::raise(SIGKILL);
    if (mode == "max") std::raise(SIGSTOP);
    std::this_thread::sleep_for(std::chrono::hours(1));  // "hang", "split"
  }
  if (mode == "max") {
    (void)dtr::all_ranks_max(1);
  } else if (mode == "split") {
    dtr::DeviceMesh mesh({dtr::world_size()}, {"dp"});
  } else {
    pg->all_reduce(t)->wait();
  }
  std::printf("[rank %d] not reached: all_reduce completed without rank 1\n", pg->rank());
  dtr::finalize();
  return 0;
}
