#pragma once
// DeviceRoutedProcessGroup: one group of ranks with a backend per device type: collectives on
// CPU tensors go to its MPI group, collectives on CUDA tensors to its NCCL group (c10d's
// ProcessGroup with "cpu:gloo,cuda:nccl" backends). A DeviceMesh on a CUDA device whose
// backend is NCCL builds its groups this way, so the small host tensors the DTensor and
// parallel layers exchange (local sizes, from_local checks) keep working next to the device
// collectives. Calls on one backend run in issue order; the two backends are not ordered
// against each other (every host-tensor call in dtr is waited on at once).
#include <memory>

#include "runtime/process_group.h"

namespace dtr {

class DeviceRoutedProcessGroup : public ProcessGroup {
 public:
  /// `cpu` and `cuda` must be groups over the same ranks in the same order.
  /// Errors: groups of different members.
  DeviceRoutedProcessGroup(std::shared_ptr<ProcessGroup> cpu, std::shared_ptr<ProcessGroup> cuda);

  int rank() const override { return cpu_->rank(); }
  int size() const override { return cpu_->size(); }
  const std::vector<int>& ranks() const override { return cpu_->ranks(); }
  std::string name() const override { return cuda_->name(); }

  WorkPtr all_reduce(Tensor& t, ReduceOp op = ReduceOp::SUM) override;
  WorkPtr all_gather(Tensor& out, const Tensor& in) override;
  WorkPtr reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::SUM) override;
  WorkPtr broadcast(Tensor& t, int root) override;
  WorkPtr all_to_all(Tensor& out, const Tensor& in) override;
  WorkPtr all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits) override;
  WorkPtr send(const Tensor& t, int dst, int tag = 0) override;
  WorkPtr recv(Tensor& t, int src, int tag = 0) override;
  /// On the MPI group.
  WorkPtr barrier() override;

 private:
  /// The backend of `t`'s device; counts the call (input bytes, as every group does).
  ProcessGroup& route(const Tensor& t, CommKind kind);
  std::shared_ptr<ProcessGroup> cpu_, cuda_;
};

}  // namespace dtr
