#pragma once
// MpiProcessGroup: ProcessGroup over an MPI communicator for CPU tensors. Each group owns a
// communication thread (WorkQueue): every call enqueues and returns a Work at once, calls run
// in issue order and progress while the caller computes. Needs MPI_THREAD_MULTIPLE (dtr::init).
// Each collective first waits, sleeping, until every rank has issued it (wait_for_peers), then
// runs the blocking MPI call: the thread spins at most 100 us while a peer is behind, then sleeps.
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/process_group.h"
#include "runtime/work_queue.h"

namespace dtr {

/// Collectives over MPI for CPU tensors.
/// Dtypes: f64/f32/i64/i32/u8 use native MPI types; bf16/f16 reductions accumulate in f32
/// (convert, reduce, convert back); all_gather / broadcast / all_to_all / send / recv move bytes.
/// Non-contiguous tensors are staged through a contiguous copy (results copied back). AVG = SUM
/// then divide by the group size (floating dtypes only). Shapes are checked at issue time
/// (dtr::Error naming the collective, shapes and group); errors inside the thread are rethrown
/// by Work::wait. DTR_COMM_DEBUG=1 compares (kind, numel, dtype) across ranks before each
/// collective. A size-1 group completes every call at once without MPI.
/// Counters: calls and input bytes per kind (all_gather: bytes of `in`; recv: bytes received).
class MpiProcessGroup : public ProcessGroup {
 public:
  /// Wraps `comm` (owned: freed in the destructor; MPI_COMM_NULL for a size-1 group without
  /// MPI). `name` is used in messages.
  MpiProcessGroup(MPI_Comm comm, std::string name);
  ~MpiProcessGroup() override;

  /// A group over all world ranks (MPI_Comm_dup of MPI_COMM_WORLD; size 1 without MPI).
  /// Collective over the world.
  static std::shared_ptr<MpiProcessGroup> world(const std::string& name = "world");
  /// A group over the given world ranks (in that order) by MPI_Comm_create_group: collective
  /// over those ranks only; this rank must be one of them. Errors: duplicates, out of range,
  /// this rank absent.
  static std::shared_ptr<MpiProcessGroup> create(const std::vector<int>& world_ranks, const std::string& name);
  /// Splits the world: ranks with equal `color` form a group ordered by `key`. Collective over
  /// the world. `name` may contain "{ranks}", replaced by the member list, e.g. "tp{0,1}".
  static std::shared_ptr<MpiProcessGroup> split(int color, int key, const std::string& name);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& ranks() const override { return ranks_; }
  std::string name() const override { return name_; }
  /// The communicator (MPI_COMM_NULL for a size-1 group created without MPI).
  MPI_Comm comm() const { return comm_; }

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

 private:
  WorkPtr enqueue(CommKind kind, const std::string& what, std::function<void()> task);
  /// Debug mode: all ranks compare `sig` (kind, numel, dtype, op, root); raises on all ranks
  /// when they differ.
  void check_signature(const std::string& what, const std::vector<int64_t>& sig) const;
  /// Returns once every rank of the group has reached this point (MPI_Ibarrier polled with a
  /// sleeping back-off on the communication thread), so that the blocking collective after it
  /// does not busy-poll a core while a peer is still computing.
  void wait_for_peers(const std::string& what) const;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> ranks_;
  std::string name_;
  std::unique_ptr<WorkQueue> queue_;  // null for size-1 groups
};

}  // namespace dtr
