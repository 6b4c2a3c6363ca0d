#include "runtime/nccl_process_group.h"

#include <sstream>

#include "runtime/env.h"
#include "runtime/mpi_staging.h"
#include "runtime/watchdog.h"
#include "runtime/work_queue.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/cuda_context.h"

namespace dtr {
namespace {

cudaStream_t g_compute = nullptr;  // nullptr: dtr's compute stream (cuda::current_stream())

void cuda_check(cudaError_t e, const std::string& what) {
  DTR_CHECK(e == cudaSuccess, what, ": CUDA error: ", cudaGetErrorString(e));
}
void nccl_check(ncclResult_t r, const std::string& what) {
  DTR_CHECK(r == ncclSuccess, what, ": NCCL error: ", ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f64: return ncclFloat64;
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i64: return ncclInt64;
    case DType::i32: return ncclInt32;
    case DType::u8:
    case DType::bool_: return ncclUint8;
  }
  DTR_ERROR("nccl: unknown dtype ", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return ncclSum;
    case ReduceOp::AVG: return ncclAvg;
    case ReduceOp::MAX: return ncclMax;
    case ReduceOp::MIN: return ncclMin;
    case ReduceOp::PRODUCT: return ncclProd;
  }
  DTR_ERROR("nccl: unknown ReduceOp ", static_cast<int>(op));
}

std::string desc(const Tensor& t) { return detail::cat(t.sizes(), " ", dtype_name(t.dtype())); }
Shape trailing(const Tensor& t) { return t.dim() == 0 ? Shape{} : Shape(t.sizes().begin() + 1, t.sizes().end()); }

/// The NCCL world communicator (unique id from rank 0, broadcast over MPI_COMM_WORLD).
ncclComm_t world_comm() {
  static ncclComm_t comm = [] {
    int ndev = 0;
    cuda_check(cudaGetDeviceCount(&ndev), "NcclProcessGroup: cudaGetDeviceCount");
    DTR_CHECK(ndev > 0, "NcclProcessGroup: no CUDA device");
    cuda_check(cudaSetDevice(dtr::local_rank() % ndev), "NcclProcessGroup: cudaSetDevice");
    ncclUniqueId id;
    if (dtr::rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    CommDeadline d("NCCL id broadcast + ncclCommInitRank", "nccl world");
    if (dtr::world_size() > 1) MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t c;
    nccl_check(ncclCommInitRank(&c, dtr::world_size(), id, dtr::rank()), "ncclCommInitRank (world)");
    return c;
  }();
  return comm;
}

/// Work of one NCCL call: a completion event on the group stream.
class NcclWork : public Work {
 public:
  NcclWork(cudaEvent_t ev, ncclComm_t comm, std::vector<Tensor> keep, std::string what)
      : ev_(ev), comm_(comm), keep_(std::move(keep)), what_(std::move(what)) {}
  ~NcclWork() override { cudaEventDestroy(ev_); }
  /// Makes the compute stream wait for the collective (the host does not block).
  void wait() override {
    check_async();
    cuda_check(cudaStreamWaitEvent(NcclProcessGroup::compute_stream(), ev_, 0), what_ + ": cudaStreamWaitEvent");
  }
  bool is_completed() override {
    check_async();
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) return false;
    cuda_check(e, what_ + ": cudaEventQuery");
    keep_.clear();
    return true;
  }

 private:
  void check_async() {
    ncclResult_t r = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm_, &r), what_ + ": ncclCommGetAsyncError");
    nccl_check(r, what_ + " (asynchronous error)");
  }
  cudaEvent_t ev_;
  ncclComm_t comm_;
  std::vector<Tensor> keep_;
  std::string what_;
};

}  // namespace

void NcclProcessGroup::set_compute_stream(cudaStream_t s) { g_compute = s; }
cudaStream_t NcclProcessGroup::compute_stream() { return g_compute ? g_compute : cuda::current_stream(); }

NcclProcessGroup::NcclProcessGroup(ncclComm_t comm, std::vector<int> ranks, int rank, std::string name)
    : comm_(comm), rank_(rank), size_(static_cast<int>(ranks.size())), ranks_(std::move(ranks)) {
  const auto pos = name.find("{ranks}");
  if (pos != std::string::npos) {
    std::ostringstream os;
    os << "{";
    for (size_t i = 0; i < ranks_.size(); ++i) os << (i ? "," : "") << ranks_[i];
    os << "}";
    name.replace(pos, 7, os.str());
  }
  name_ = std::move(name);
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "NcclProcessGroup " + name_);
  cuda_check(cudaMalloc(&barrier_buf_, sizeof(float)), "NcclProcessGroup " + name_ + ": cudaMalloc");
}

NcclProcessGroup::~NcclProcessGroup() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (barrier_buf_) cudaFree(barrier_buf_);
  if (comm_ && comm_ != world_comm()) ncclCommDestroy(comm_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::shared_ptr<NcclProcessGroup> NcclProcessGroup::split(int color, int key, const std::string& name) {
  ncclComm_t world = world_comm();
  // Membership (world ranks in key order) from an MPI split with the same color and key.
  std::vector<int> ranks = {dtr::rank()};
  int rank = 0;
  CommDeadline d("MPI_Comm_split + ncclCommSplit", "NcclProcessGroup " + name);
  if (dtr::world_size() > 1) {
    MPI_Comm c;
    mpi::check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &c), "MPI_Comm_split", "NcclProcessGroup " + name);
    int n = 0;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &rank);
    ranks.resize(n);
    int me = dtr::rank();
    MPI_Allgather(&me, 1, MPI_INT, ranks.data(), 1, MPI_INT, c);
    MPI_Comm_free(&c);
  }
  ncclComm_t sub;
  nccl_check(ncclCommSplit(world, color, key, &sub, nullptr), "ncclCommSplit (" + name + ")");
  return std::make_shared<NcclProcessGroup>(sub, ranks, rank, name);
}

std::shared_ptr<NcclProcessGroup> NcclProcessGroup::world(const std::string& name) { return split(0, dtr::rank(), name); }

void NcclProcessGroup::check_tensor(const Tensor& t, const std::string& what) const {
  DTR_CHECK(t.device().is_cuda(), what, " on group ", name_, ": NCCL needs CUDA tensors, got ", t.device());
  DTR_CHECK(t.is_contiguous(), what, " on group ", name_, ": NCCL needs contiguous tensors (call contiguous())");
}

WorkPtr NcclProcessGroup::run(CommKind kind, int64_t bytes, const std::string& what, std::vector<Tensor> keep,
                              const std::function<ncclResult_t(cudaStream_t)>& launch) {
  counters_.add(kind, bytes);
  cudaEvent_t ready, done;
  cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
  cuda_check(cudaEventRecord(ready, compute_stream()), what + ": cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(stream_, ready, 0), what + ": cudaStreamWaitEvent");
  cudaEventDestroy(ready);
  nccl_check(launch(stream_), what + " on group " + name_);
  // The tensors are used on the group stream: the caching allocator must not hand their
  // blocks to the compute stream before this collective finished, even if the Work is
  // dropped without wait() (c10d's recordStream).
  for (const Tensor& t : keep)
    if (t.defined() && t.storage() && cuda::owns(t.storage()->data())) cuda::record_stream(t.storage()->data(), stream_);
  cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
  cuda_check(cudaEventRecord(done, stream_), what + ": cudaEventRecord");
  return std::make_shared<NcclWork>(done, comm_, std::move(keep), what + " on group " + name_);
}

WorkPtr NcclProcessGroup::all_reduce(Tensor& t, ReduceOp op) {
  const std::string what = detail::cat("all_reduce(", reduce_op_name(op), ", ", desc(t), ")");
  check_tensor(t, what);
  DTR_CHECK(op != ReduceOp::AVG || is_floating(t.dtype()), what, " on group ", name_, ": AVG needs a floating dtype");
  t.bump_version();
  return run(CommKind::all_reduce, t.nbytes(), what, {t}, [&](cudaStream_t s) {
    return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.dtype()), nccl_op(op), comm_, s);
  });
}

WorkPtr NcclProcessGroup::all_gather(Tensor& out, const Tensor& in) {
  const std::string what = detail::cat("all_gather(out ", desc(out), ", in ", desc(in), ")");
  check_tensor(out, what);
  check_tensor(in, what);
  DTR_CHECK(out.dtype() == in.dtype() && out.numel() == size_ * in.numel() &&
                (in.dim() == 0 || (out.size(0) == size_ * in.size(0) && trailing(out) == trailing(in))),
            what, " on group ", name_, ": expected out = group size ", size_, " times in along dim 0, same dtype");
  out.bump_version();
  return run(CommKind::all_gather, in.nbytes(), what, {out, in}, [&](cudaStream_t s) {
    return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in.dtype()), comm_, s);
  });
}

WorkPtr NcclProcessGroup::reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  const std::string what = detail::cat("reduce_scatter(", reduce_op_name(op), ", out ", desc(out), ", in ", desc(in), ")");
  check_tensor(out, what);
  check_tensor(in, what);
  DTR_CHECK(out.dtype() == in.dtype() && in.dim() >= 1 && out.dim() == in.dim() && in.size(0) == size_ * out.size(0) &&
                trailing(out) == trailing(in),
            what, " on group ", name_, ": expected in [", size_, " * n0, ...] and out [n0, ...], same dtype");
  out.bump_version();
  return run(CommKind::reduce_scatter, in.nbytes(), what, {out, in}, [&](cudaStream_t s) {
    return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in.dtype()), nccl_op(op), comm_, s);
  });
}

WorkPtr NcclProcessGroup::broadcast(Tensor& t, int root) {
  const std::string what = detail::cat("broadcast(", desc(t), ", root ", root, ")");
  check_tensor(t, what);
  DTR_CHECK(root >= 0 && root < size_, what, " on group ", name_, ": root must be in [0, ", size_, ")");
  if (rank_ != root) t.bump_version();
  return run(CommKind::broadcast, t.nbytes(), what, {t}, [&](cudaStream_t s) {
    return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t.dtype()), root, comm_, s);
  });
}

WorkPtr NcclProcessGroup::all_to_all(Tensor& out, const Tensor& in) {
  DTR_CHECK(in.dim() >= 1 && in.size(0) % size_ == 0, "all_to_all(in ", desc(in), ") on group ", name_,
            ": dim 0 must be divisible by the group size ", size_);
  std::vector<int64_t> splits(size_, in.size(0) / size_);
  return all_to_all(out, in, splits, splits);
}

WorkPtr NcclProcessGroup::all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                                     const std::vector<int64_t>& in_splits) {
  const std::string what = detail::cat("all_to_all(out ", desc(out), ", in ", desc(in), ")");
  check_tensor(out, what);
  check_tensor(in, what);
  DTR_CHECK(out.dtype() == in.dtype() && in.dim() >= 1 && out.dim() == in.dim() && trailing(out) == trailing(in) &&
                static_cast<int>(out_splits.size()) == size_ && static_cast<int>(in_splits.size()) == size_,
            what, " on group ", name_, ": expected equal dtypes and dims after dim 0, and ", size_, " splits each");
  int64_t so = 0, si = 0;
  for (int j = 0; j < size_; ++j) so += out_splits[j], si += in_splits[j];
  DTR_CHECK(so == out.size(0) && si == in.size(0), what, " on group ", name_, ": splits must sum to dim 0");
  int64_t row = 1;
  for (int64_t d : trailing(in)) row *= d;
  const size_t isz = itemsize(in.dtype());
  out.bump_version();
  return run(CommKind::all_to_all, in.nbytes(), what, {out, in}, [&](cudaStream_t s) {
    const ncclDataType_t dt = nccl_type(in.dtype());
    char* sp = static_cast<char*>(in.data_ptr());
    char* rp = static_cast<char*>(out.data_ptr());
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (int j = 0; j < size_; ++j) {
      if ((r = ncclSend(sp, in_splits[j] * row, dt, j, comm_, s)) != ncclSuccess) break;
      if ((r = ncclRecv(rp, out_splits[j] * row, dt, j, comm_, s)) != ncclSuccess) break;
      sp += in_splits[j] * row * isz;
      rp += out_splits[j] * row * isz;
    }
    const ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
  });
}

WorkPtr NcclProcessGroup::send(const Tensor& t, int dst, int tag) {
  const std::string what = detail::cat("send(", desc(t), ", dst ", dst, ")");
  check_tensor(t, what);
  DTR_CHECK(dst >= 0 && dst < size_ && dst != rank_, what, " on group ", name_, ": dst must be another rank");
  return run(CommKind::send, t.nbytes(), what, {t}, [&](cudaStream_t s) {
    return ncclSend(t.data_ptr(), t.numel(), nccl_type(t.dtype()), dst, comm_, s);
  });
}

WorkPtr NcclProcessGroup::recv(Tensor& t, int src, int tag) {
  const std::string what = detail::cat("recv(", desc(t), ", src ", src, ")");
  check_tensor(t, what);
  DTR_CHECK(src >= 0 && src < size_ && src != rank_, what, " on group ", name_, ": src must be another rank");
  t.bump_version();
  return run(CommKind::recv, t.nbytes(), what, {t}, [&](cudaStream_t s) {
    return ncclRecv(t.data_ptr(), t.numel(), nccl_type(t.dtype()), src, comm_, s);
  });
}

WorkPtr NcclProcessGroup::barrier() {
  return run(CommKind::barrier, 0, "barrier()", {}, [&](cudaStream_t s) {
    return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, s);
  });
}

}  // namespace dtr
