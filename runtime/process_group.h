#pragma once
// ProcessGroup: collectives over a fixed set of ranks, every call asynchronous (returns a
// Work), calls on one group executed in issue order. Semantics follow torch.distributed
// (c10d ProcessGroup). Implementations: MpiProcessGroup (CPU tensors, a communication thread
// per group), NcclProcessGroup (CUDA tensors).
#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace dtr {

enum class ReduceOp : uint8_t { SUM, AVG, MAX, MIN, PRODUCT };
const char* reduce_op_name(ReduceOp op);

/// Kinds of communication, for the byte counters.
enum class CommKind : uint8_t { all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send, recv, barrier };
constexpr int kNumCommKinds = 8;
const char* comm_kind_name(CommKind k);

/// Per-group counters: number of calls and bytes this rank sent (input bytes of the call as
/// nccl-tests counts them) per collective kind. Read by tests and benchmarks.
struct CommCounters {
  std::array<std::atomic<int64_t>, kNumCommKinds> calls{};
  std::array<std::atomic<int64_t>, kNumCommKinds> bytes{};
  int64_t count(CommKind k) const { return calls[static_cast<int>(k)].load(); }
  int64_t nbytes(CommKind k) const { return bytes[static_cast<int>(k)].load(); }
  void add(CommKind k, int64_t b) {
    calls[static_cast<int>(k)].fetch_add(1);
    bytes[static_cast<int>(k)].fetch_add(b);
  }
  void reset() {
    for (auto& c : calls) c.store(0);
    for (auto& b : bytes) b.store(0);
  }
};

/// Handle of an issued collective. wait() blocks until it finished and rethrows its error
/// (as dtr::Error naming the collective and group); is_completed() polls.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

/// A group of ranks that communicate. All tensors are local (never distributed); dim-0
/// concatenation is the layout of all_gather / reduce_scatter / all_to_all.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  /// This process's rank in the group, and the group size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Global (world) ranks of the members, in group-rank order.
  virtual const std::vector<int>& ranks() const = 0;
  virtual std::string name() const = 0;

  /// In place: t = reduce over ranks of t.
  virtual WorkPtr all_reduce(Tensor& t, ReduceOp op = ReduceOp::SUM) = 0;
  /// out [size * n0, ...] = concatenation over ranks of in [n0, ...] along dim 0.
  virtual WorkPtr all_gather(Tensor& out, const Tensor& in) = 0;
  /// out [n0, ...] = chunk `rank` (along dim 0) of the reduction over ranks of in [size * n0, ...].
  virtual WorkPtr reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::SUM) = 0;
  /// In place: t = t of group rank `root`.
  virtual WorkPtr broadcast(Tensor& t, int root) = 0;
  /// Equal splits: chunk j (dim 0) of `in` goes to rank j; out chunk j comes from rank j.
  virtual WorkPtr all_to_all(Tensor& out, const Tensor& in) = 0;
  /// Given splits (rows along dim 0): in_splits[j] rows go to rank j, out_splits[j] rows come from j.
  virtual WorkPtr all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                             const std::vector<int64_t>& in_splits) = 0;
  virtual WorkPtr send(const Tensor& t, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(Tensor& t, int src, int tag = 0) = 0;
  virtual WorkPtr barrier() = 0;

  CommCounters& counters() { return counters_; }

 protected:
  CommCounters counters_;
};

}  // namespace dtr
