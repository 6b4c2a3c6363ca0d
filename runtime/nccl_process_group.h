#pragma once
// NcclProcessGroup: ProcessGroup over NCCL for CUDA tensors (built when DTR_CUDA is on).
// The world communicator is bootstrapped by broadcasting an ncclUniqueId over MPI; groups are
// sub-communicators made by ncclCommSplit. Each group has its own CUDA stream: a call makes
// that stream wait (event) for the work already queued on the compute stream, enqueues the
// NCCL kernel and records a completion event; Work::wait makes the compute stream wait for
// that event (the host does not block), is_completed polls it. Source: c10d ProcessGroupNCCL.
#ifdef DTR_WITH_CUDA
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/process_group.h"

namespace dtr {

/// Collectives over NCCL for contiguous CUDA tensors on this rank's device (local rank modulo
/// the device count). Dtypes: f64, f32, bf16, f16 (NCCL reduces them natively), i64, i32, u8.
/// AVG uses ncclAvg. Tensors must stay alive until the Work completed (the Work holds them).
/// Errors: non-CUDA or non-contiguous tensors, shape mismatches (dtr::Error naming the
/// collective, shapes and group); NCCL errors (ncclGetErrorString) and asynchronous NCCL
/// errors, found by is_completed() / synchronize(), are raised as dtr::Error.
class NcclProcessGroup : public ProcessGroup {
 public:
  /// Splits the world: ranks with equal `color` form a group ordered by `key` (collective over
  /// the world; the NCCL world communicator is created on first use). "{ranks}" in `name` is
  /// replaced by the member list.
  static std::shared_ptr<NcclProcessGroup> split(int color, int key, const std::string& name);
  /// A group over all world ranks.
  static std::shared_ptr<NcclProcessGroup> world(const std::string& name = "world");
  ~NcclProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& ranks() const override { return ranks_; }
  std::string name() const override { return name_; }
  /// The communication stream of this group.
  cudaStream_t stream() const { return stream_; }
  /// The compute stream calls order against and Work::wait makes wait (default: dtr's compute
  /// stream of the current device, cuda::current_stream(); nullptr restores the default).
  static void set_compute_stream(cudaStream_t s);
  static cudaStream_t compute_stream();

  WorkPtr all_reduce(Tensor& t, ReduceOp op = ReduceOp::SUM) override;
  WorkPtr all_gather(Tensor& out, const Tensor& in) override;
  WorkPtr reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::SUM) override;
  WorkPtr broadcast(Tensor& t, int root) override;
  WorkPtr all_to_all(Tensor& out, const Tensor& in) override;
  WorkPtr all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits) override;
  WorkPtr send(const Tensor& t, int dst, int tag = 0) override;
  WorkPtr recv(Tensor& t, int src, int tag = 0) override;
  WorkPtr barrier() override;

  NcclProcessGroup(ncclComm_t comm, std::vector<int> ranks, int rank, std::string name);

 private:
  /// Orders the group stream after the compute stream, runs `launch` on the group stream and
  /// returns a Work holding `keep` alive until completion.
  WorkPtr run(CommKind kind, int64_t bytes, const std::string& what, std::vector<Tensor> keep,
              const std::function<ncclResult_t(cudaStream_t)>& launch);
  void check_tensor(const Tensor& t, const std::string& what) const;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::vector<int> ranks_;
  std::string name_;
  void* barrier_buf_ = nullptr;  // one float on the device (barrier)
};

}  // namespace dtr
#endif  // DTR_WITH_CUDA
