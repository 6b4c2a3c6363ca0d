// DeviceRoutedProcessGroup (see device_routed_process_group.h).
#include "runtime/device_routed_process_group.h"

#include "tensor/error.h"

namespace dtr {

DeviceRoutedProcessGroup::DeviceRoutedProcessGroup(std::shared_ptr<ProcessGroup> cpu, std::shared_ptr<ProcessGroup> cuda)
    : cpu_(std::move(cpu)), cuda_(std::move(cuda)) {
  DTR_CHECK(cpu_ && cuda_ && cpu_->ranks() == cuda_->ranks() && cpu_->rank() == cuda_->rank(),
            "DeviceRoutedProcessGroup: the CPU and CUDA groups must have the same members");
}

ProcessGroup& DeviceRoutedProcessGroup::route(const Tensor& t, CommKind kind) {
  counters_.add(kind, static_cast<int64_t>(t.nbytes()));
  return t.device().is_cuda() ? *cuda_ : *cpu_;
}

WorkPtr DeviceRoutedProcessGroup::all_reduce(Tensor& t, ReduceOp op) {
  return route(t, CommKind::all_reduce).all_reduce(t, op);
}
WorkPtr DeviceRoutedProcessGroup::all_gather(Tensor& out, const Tensor& in) {
  return route(in, CommKind::all_gather).all_gather(out, in);
}
WorkPtr DeviceRoutedProcessGroup::reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  return route(in, CommKind::reduce_scatter).reduce_scatter(out, in, op);
}
WorkPtr DeviceRoutedProcessGroup::broadcast(Tensor& t, int root) {
  return route(t, CommKind::broadcast).broadcast(t, root);
}
WorkPtr DeviceRoutedProcessGroup::all_to_all(Tensor& out, const Tensor& in) {
  return route(in, CommKind::all_to_all).all_to_all(out, in);
}
WorkPtr DeviceRoutedProcessGroup::all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                                             const std::vector<int64_t>& in_splits) {
  return route(in, CommKind::all_to_all).all_to_all(out, in, out_splits, in_splits);
}
WorkPtr DeviceRoutedProcessGroup::send(const Tensor& t, int dst, int tag) {
  return route(t, CommKind::send).send(t, dst, tag);
}
WorkPtr DeviceRoutedProcessGroup::recv(Tensor& t, int src, int tag) {
  return route(t, CommKind::recv).recv(t, src, tag);
}
WorkPtr DeviceRoutedProcessGroup::barrier() {
  counters_.add(CommKind::barrier, 0);
  return cpu_->barrier();
}

}  // namespace dtr
