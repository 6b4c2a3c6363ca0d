#include "runtime/mpi_process_group.h"

#include <chrono>
#include <numeric>
#include <sstream>
#include <thread>

#include "runtime/env.h"
#include "runtime/mpi_staging.h"
#include "runtime/watchdog.h"
#include "tensor/ops/cpu/copy_kernel.h"

namespace dtr {
namespace {

std::string desc(const Tensor& t) { return detail::cat(t.sizes(), " ", dtype_name(t.dtype())); }

Shape trailing(const Tensor& t) { return t.dim() == 0 ? Shape{} : Shape(t.sizes().begin() + 1, t.sizes().end()); }

/// out = in for a size-1 group (shapes have equal numel; out is viewed as in's shape).
void local_copy(Tensor& out, const Tensor& in) {
  if (out.numel() == 0) return;
  Tensor src = in.sizes() == out.sizes() ? in : in.contiguous().reshape(out.sizes());
  if (out.device().is_cpu() && src.device().is_cpu()) {
    cpu::copy_strided(out, src);
  } else {
    out.copy_(src);
  }
}

bool is_mpi_live() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

/// Work of a send / recv: the queue task posts MPI_Isend / MPI_Irecv (so calls stay in issue
/// order without blocking the queue), wait() then completes the request (bounded by the
/// communication timeout) and copies a staged receive back.
struct P2pState {
  std::mutex mu;
  MPI_Request req = MPI_REQUEST_NULL;
  bool done = false;
  mpi::Staged staged;
  bool copy_back = false;
  explicit P2pState(const Tensor& t) : staged(t) {}
};

class P2pWork : public Work {
 public:
  P2pWork(WorkPtr posted, std::shared_ptr<P2pState> st, std::string what, std::string group)
      : posted_(std::move(posted)), st_(std::move(st)), what_(std::move(what)), group_(std::move(group)) {}
  void wait() override {
    posted_->wait();
    const auto start = std::chrono::steady_clock::now();
    auto sleep = std::chrono::microseconds(1);
    while (!test()) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s > comm_timeout_s()) comm_timed_out(what_, group_);
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    }
  }
  bool is_completed() override { return posted_->is_completed() && test(); }

 private:
  bool test() {
    std::lock_guard<std::mutex> lk(st_->mu);
    if (st_->done) return true;
    int flag = 0;
    mpi::check(MPI_Test(&st_->req, &flag, MPI_STATUS_IGNORE), "MPI_Test", what_ + " on group " + group_);
    if (!flag) return false;
    if (st_->copy_back) st_->staged.store();
    st_->done = true;
    return true;
  }
  WorkPtr posted_;
  std::shared_ptr<P2pState> st_;
  std::string what_, group_;
};

}  // namespace

// ---- arrival wait ------------------------------------------------------------------------------
void MpiProcessGroup::wait_for_peers(const std::string& what) const {
  // Open MPI's blocking collectives busy-poll until every rank has arrived: on a machine with
  // one core per rank that spin takes the core from this rank's (or a peer's) compute thread
  // for as long as the slowest rank is behind. An MPI_Ibarrier polled by MPI_Test waits for the
  // arrival: tight polls for the first kSpin (a peer that is only a little late, as in the
  // tensor-parallel collectives on the critical path, costs no sleep: a sleep_for(1 us) sleeps
  // ~50 us with Linux's timer slack), then a sleeping back-off (1 us doubling to 256 us; 2 ms
  // once the wait passes kLongWait, so that each wakeup, tens of us of CPU on a VM, is paid at
  // most ~500 times a second and the added latency stays under a tenth of the wait) that does
  // not burn a core; the collective itself, entered once all ranks are there, stays the same MPI
  // call (same algorithm, same bits).
  constexpr auto kSpin = std::chrono::microseconds(100);
  constexpr auto kLongWait = std::chrono::milliseconds(20);
  MPI_Request req = MPI_REQUEST_NULL;
  mpi::check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", what + " (arrival wait) on group " + name_);
  int flag = 0;
  auto sleep = std::chrono::microseconds(1);
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    mpi::check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test", what + " (arrival wait) on group " + name_);
    if (flag) return;
    if (std::chrono::steady_clock::now() - t0 < kSpin) continue;
    std::this_thread::sleep_for(sleep);
    const bool long_wait = std::chrono::steady_clock::now() - t0 > kLongWait;
    sleep = std::min(sleep * 2, std::chrono::microseconds(long_wait ? 2000 : 256));
  }
}

// ---- construction ------------------------------------------------------------------------------
MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::string name) : comm_(comm) {
  if (comm_ == MPI_COMM_NULL) {
    ranks_ = {dtr::rank()};
  } else {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Group g, wg;
    MPI_Comm_group(comm_, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    std::vector<int> mine(size_);
    std::iota(mine.begin(), mine.end(), 0);
    ranks_.resize(size_);
    MPI_Group_translate_ranks(g, size_, mine.data(), wg, ranks_.data());
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
  }
  const auto pos = name.find("{ranks}");
  if (pos != std::string::npos) {
    std::ostringstream os;
    os << "{";
    for (size_t i = 0; i < ranks_.size(); ++i) os << (i ? "," : "") << ranks_[i];
    os << "}";
    name.replace(pos, 7, os.str());
  }
  name_ = std::move(name);
  if (size_ > 1) queue_ = std::make_unique<WorkQueue>(name_);
}

MpiProcessGroup::~MpiProcessGroup() {
  queue_.reset();  // drains pending work first
  if (comm_ != MPI_COMM_NULL && is_mpi_live()) MPI_Comm_free(&comm_);
}

std::shared_ptr<MpiProcessGroup> MpiProcessGroup::world(const std::string& name) {
  if (!is_mpi_live() || dtr::world_size() == 1) return std::make_shared<MpiProcessGroup>(MPI_COMM_NULL, name);
  MPI_Comm c;
  {
    CommDeadline d("MPI_Comm_dup", "process group " + name);
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
  }
  return std::make_shared<MpiProcessGroup>(c, name);
}

std::shared_ptr<MpiProcessGroup> MpiProcessGroup::split(int color, int key, const std::string& name) {
  if (!is_mpi_live() || dtr::world_size() == 1) return std::make_shared<MpiProcessGroup>(MPI_COMM_NULL, name);
  MPI_Comm c;
  {
    CommDeadline d("MPI_Comm_split", "process group " + name);
    mpi::check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &c), "MPI_Comm_split", "process group " + name);
  }
  return std::make_shared<MpiProcessGroup>(c, name);
}

std::shared_ptr<MpiProcessGroup> MpiProcessGroup::create(const std::vector<int>& world_ranks, const std::string& name) {
  const int me = dtr::rank(), world = dtr::world_size();
  std::vector<bool> seen(world, false);
  bool member = false;
  for (int r : world_ranks) {
    DTR_CHECK(r >= 0 && r < world, "process group ", name, ": rank ", r, " out of range for world size ", world);
    DTR_CHECK(!seen[r], "process group ", name, ": rank ", r, " listed twice");
    seen[r] = true;
    member |= r == me;
  }
  DTR_CHECK(member, "process group ", name, ": this rank ", me, " is not a member");
  if (world_ranks.size() == 1 || !is_mpi_live()) return std::make_shared<MpiProcessGroup>(MPI_COMM_NULL, name);
  MPI_Group wg, g;
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Group_incl(wg, static_cast<int>(world_ranks.size()), world_ranks.data(), &g);
  MPI_Comm c;
  {
    CommDeadline d("MPI_Comm_create_group", "process group " + name);
    mpi::check(MPI_Comm_create_group(MPI_COMM_WORLD, g, 0, &c), "MPI_Comm_create_group", "process group " + name);
  }
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  return std::make_shared<MpiProcessGroup>(c, name);
}

// ---- helpers -----------------------------------------------------------------------------------
WorkPtr MpiProcessGroup::enqueue(CommKind kind, const std::string& what, std::function<void()> task) {
  return queue_->enqueue(what, std::move(task));
}

void MpiProcessGroup::check_signature(const std::string& what, const std::vector<int64_t>& sig) const {
  const int k = static_cast<int>(sig.size());
  std::vector<int64_t> all(static_cast<size_t>(k) * size_);
  mpi::check(MPI_Allgather(sig.data(), k, MPI_INT64_T, all.data(), k, MPI_INT64_T, comm_), "MPI_Allgather",
             what + " (debug signature check) on group " + name_);
  bool same = true;
  for (int r = 1; r < size_; ++r)
    for (int j = 0; j < k; ++j) same &= all[r * k + j] == all[j];
  if (same) return;
  std::ostringstream os;
  os << what << " on group " << name_ << ": ranks disagree (DTR_COMM_DEBUG check):";
  for (int r = 0; r < size_; ++r) {
    const int64_t* s = &all[r * k];
    os << " rank " << r << " (world " << ranks_[r] << "): " << comm_kind_name(static_cast<CommKind>(s[0]))
       << " numel " << s[1] << " " << dtype_name(static_cast<DType>(s[2]));
    if (s[0] == static_cast<int64_t>(CommKind::all_reduce) || s[0] == static_cast<int64_t>(CommKind::reduce_scatter))
      os << " " << reduce_op_name(static_cast<ReduceOp>(s[3]));
    if (s[0] == static_cast<int64_t>(CommKind::broadcast)) os << " root " << s[4];
    os << (r + 1 < size_ ? ";" : "");
  }
  DTR_ERROR(os.str());
}

// ---- collectives -------------------------------------------------------------------------------
WorkPtr MpiProcessGroup::all_reduce(Tensor& t, ReduceOp op) {
  const std::string what = detail::cat("all_reduce(", reduce_op_name(op), ", ", desc(t), ")");
  DTR_CHECK(op != ReduceOp::AVG || is_floating(t.dtype()), what, " on group ", name_,
            ": AVG needs a floating dtype, got ", dtype_name(t.dtype()));
  counters_.add(CommKind::all_reduce, static_cast<int64_t>(t.nbytes()));
  t.bump_version();
  if (size_ == 1) return QueuedWork::completed(what, name_);
  mpi::Staged s(t);
  const int64_t n = t.numel();
  return enqueue(CommKind::all_reduce, what, [this, s, n, op, what]() mutable {
    wait_for_peers(what);
    if (comm_debug())
      check_signature(what, {int64_t(CommKind::all_reduce), n, int64_t(s.buf.dtype()), int64_t(op), -1});
    s.load();
    const int cnt = mpi::count(n, what);
    if (is_low_precision(s.buf.dtype())) {
      auto f = mpi::to_f32(s.buf);
      mpi::check(MPI_Allreduce(MPI_IN_PLACE, f.data(), cnt, MPI_FLOAT, mpi::op(op), comm_), "MPI_Allreduce", what);
      if (op == ReduceOp::AVG) mpi::divide(f, size_);
      mpi::from_f32(f, s.buf);
    } else {
      mpi::check(MPI_Allreduce(MPI_IN_PLACE, s.data(), cnt, mpi::datatype(s.buf.dtype()), mpi::op(op), comm_),
                 "MPI_Allreduce", what);
      if (op == ReduceOp::AVG) mpi::divide(s.buf, size_);
    }
    s.store();
  });
}

WorkPtr MpiProcessGroup::all_gather(Tensor& out, const Tensor& in) {
  const std::string what = detail::cat("all_gather(out ", desc(out), ", in ", desc(in), ")");
  DTR_CHECK(out.dtype() == in.dtype(), what, " on group ", name_, ": dtypes differ");
  const bool ok = in.dim() == 0 ? (out.dim() == 1 && out.size(0) == size_)
                                : (out.dim() == in.dim() && out.size(0) == size_ * in.size(0) && trailing(out) == trailing(in));
  DTR_CHECK(ok, what, " on group ", name_, ": expected out [", size_, " * ", (in.dim() ? in.size(0) : 1),
            (in.dim() > 1 ? ", ..." : ""), "] (group size ", size_, " times in along dim 0)");
  counters_.add(CommKind::all_gather, static_cast<int64_t>(in.nbytes()));
  out.bump_version();
  if (size_ == 1) {
    local_copy(out, in);
    return QueuedWork::completed(what, name_);
  }
  mpi::Staged si(in), so(out);
  const int64_t n = in.numel();
  return enqueue(CommKind::all_gather, what, [this, si, so, n, what]() mutable {
    wait_for_peers(what);
    if (comm_debug()) check_signature(what, {int64_t(CommKind::all_gather), n, int64_t(si.buf.dtype()), 0, -1});
    si.load();
    const MPI_Datatype dt = mpi::datatype(si.buf.dtype());
    const int cnt = mpi::count(n, what);
    mpi::count(n * size_, what);
    mpi::check(MPI_Allgather(si.data(), cnt, dt, so.data(), cnt, dt, comm_), "MPI_Allgather", what);
    so.store();
  });
}

WorkPtr MpiProcessGroup::reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  const std::string what =
      detail::cat("reduce_scatter(", reduce_op_name(op), ", out ", desc(out), ", in ", desc(in), ")");
  DTR_CHECK(out.dtype() == in.dtype(), what, " on group ", name_, ": dtypes differ");
  DTR_CHECK(op != ReduceOp::AVG || is_floating(in.dtype()), what, " on group ", name_,
            ": AVG needs a floating dtype, got ", dtype_name(in.dtype()));
  const bool ok = in.dim() >= 1 && out.dim() == in.dim() && in.size(0) == size_ * out.size(0) &&
                  trailing(out) == trailing(in);
  DTR_CHECK(ok, what, " on group ", name_, ": expected in [", size_, " * n0, ...] and out [n0, ...] (group size ",
            size_, ")");
  counters_.add(CommKind::reduce_scatter, static_cast<int64_t>(in.nbytes()));
  out.bump_version();
  if (size_ == 1) {
    local_copy(out, in);
    return QueuedWork::completed(what, name_);
  }
  mpi::Staged si(in), so(out);
  const int64_t n = out.numel();
  return enqueue(CommKind::reduce_scatter, what, [this, si, so, n, op, what]() mutable {
    wait_for_peers(what);
    if (comm_debug())
      check_signature(what, {int64_t(CommKind::reduce_scatter), n, int64_t(si.buf.dtype()), int64_t(op), -1});
    si.load();
    const int cnt = mpi::count(n, what);
    mpi::count(n * size_, what);
    if (is_low_precision(si.buf.dtype())) {
      auto f = mpi::to_f32(si.buf);
      std::vector<float> r(static_cast<size_t>(n));
      mpi::check(MPI_Reduce_scatter_block(f.data(), r.data(), cnt, MPI_FLOAT, mpi::op(op), comm_),
                 "MPI_Reduce_scatter_block", what);
      if (op == ReduceOp::AVG) mpi::divide(r, size_);
      mpi::from_f32(r, so.buf);
    } else {
      mpi::check(MPI_Reduce_scatter_block(si.data(), so.data(), cnt, mpi::datatype(si.buf.dtype()), mpi::op(op), comm_),
                 "MPI_Reduce_scatter_block", what);
      if (op == ReduceOp::AVG) mpi::divide(so.buf, size_);
    }
    so.store();
  });
}

WorkPtr MpiProcessGroup::broadcast(Tensor& t, int root) {
  const std::string what = detail::cat("broadcast(", desc(t), ", root ", root, ")");
  DTR_CHECK(root >= 0 && root < size_, what, " on group ", name_, ": root must be in [0, ", size_, ")");
  counters_.add(CommKind::broadcast, static_cast<int64_t>(t.nbytes()));
  if (rank_ != root) t.bump_version();
  if (size_ == 1) return QueuedWork::completed(what, name_);
  mpi::Staged s(t);
  const int64_t n = t.numel();
  return enqueue(CommKind::broadcast, what, [this, s, n, root, what]() mutable {
    wait_for_peers(what);
    if (comm_debug()) check_signature(what, {int64_t(CommKind::broadcast), n, int64_t(s.buf.dtype()), 0, root});
    if (rank_ == root) s.load();
    mpi::check(MPI_Bcast(s.data(), mpi::count(n, what), mpi::datatype(s.buf.dtype()), root, comm_), "MPI_Bcast", what);
    if (rank_ != root) s.store();
  });
}

WorkPtr MpiProcessGroup::all_to_all(Tensor& out, const Tensor& in) {
  const std::string what = detail::cat("all_to_all(out ", desc(out), ", in ", desc(in), ")");
  DTR_CHECK(out.dtype() == in.dtype(), what, " on group ", name_, ": dtypes differ");
  DTR_CHECK(in.dim() >= 1 && out.sizes() == in.sizes() && in.size(0) % size_ == 0, what, " on group ", name_,
            ": expected out and in of equal shape with dim 0 divisible by the group size ", size_);
  counters_.add(CommKind::all_to_all, static_cast<int64_t>(in.nbytes()));
  out.bump_version();
  if (size_ == 1) {
    local_copy(out, in);
    return QueuedWork::completed(what, name_);
  }
  mpi::Staged si(in), so(out);
  const int64_t n = in.numel() / size_;
  return enqueue(CommKind::all_to_all, what, [this, si, so, n, what]() mutable {
    wait_for_peers(what);
    if (comm_debug()) check_signature(what, {int64_t(CommKind::all_to_all), n * size_, int64_t(si.buf.dtype()), 0, -1});
    si.load();
    const MPI_Datatype dt = mpi::datatype(si.buf.dtype());
    const int cnt = mpi::count(n, what);
    mpi::count(n * size_, what);
    mpi::check(MPI_Alltoall(si.data(), cnt, dt, so.data(), cnt, dt, comm_), "MPI_Alltoall", what);
    so.store();
  });
}

WorkPtr MpiProcessGroup::all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& out_splits,
                                    const std::vector<int64_t>& in_splits) {
  const std::string what = detail::cat("all_to_all(out ", desc(out), ", in ", desc(in), ", out_splits ", out_splits,
                                       ", in_splits ", in_splits, ")");
  DTR_CHECK(out.dtype() == in.dtype(), what, " on group ", name_, ": dtypes differ");
  DTR_CHECK(in.dim() >= 1 && out.dim() == in.dim() && trailing(out) == trailing(in), what, " on group ", name_,
            ": expected out and in with equal dims after dim 0");
  DTR_CHECK(static_cast<int>(out_splits.size()) == size_ && static_cast<int>(in_splits.size()) == size_, what,
            " on group ", name_, ": expected ", size_, " splits each (the group size)");
  int64_t so_sum = 0, si_sum = 0;
  for (int j = 0; j < size_; ++j) {
    DTR_CHECK(out_splits[j] >= 0 && in_splits[j] >= 0, what, " on group ", name_, ": negative split");
    so_sum += out_splits[j];
    si_sum += in_splits[j];
  }
  DTR_CHECK(so_sum == out.size(0) && si_sum == in.size(0), what, " on group ", name_,
            ": splits must sum to dim 0 (out ", out.size(0), ", in ", in.size(0), "), got ", so_sum, " and ", si_sum);
  counters_.add(CommKind::all_to_all, static_cast<int64_t>(in.nbytes()));
  out.bump_version();
  if (size_ == 1) {
    local_copy(out, in);
    return QueuedWork::completed(what, name_);
  }
  int64_t row = 1;
  for (int64_t d : trailing(in)) row *= d;
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  for (int j = 0, so_off = 0, si_off = 0; j < size_; ++j) {
    sc[j] = mpi::count(in_splits[j] * row, what);
    rc[j] = mpi::count(out_splits[j] * row, what);
    sd[j] = si_off;
    rd[j] = so_off;
    si_off = mpi::count(int64_t(si_off) + sc[j], what);
    so_off = mpi::count(int64_t(so_off) + rc[j], what);
  }
  mpi::Staged si(in), so(out);
  return enqueue(CommKind::all_to_all, what, [this, si, so, row, sc, sd, rc, rd, out_splits, in_splits, what]() mutable {
    wait_for_peers(what);
    if (comm_debug()) {
      check_signature(what, {int64_t(CommKind::all_to_all), row, int64_t(si.buf.dtype()), 1, -1});
      std::vector<int64_t> got(size_);  // got[j] = rows rank j sends to this rank
      mpi::check(MPI_Alltoall(in_splits.data(), 1, MPI_INT64_T, got.data(), 1, MPI_INT64_T, comm_), "MPI_Alltoall",
                 what + " (debug split check)");
      int ok = got == out_splits ? 1 : 0, all_ok = 0;
      mpi::check(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce", what + " (debug split check)");
      DTR_CHECK(all_ok, what, " on group ", name_, ": splits disagree across ranks (DTR_COMM_DEBUG check): ranks send ",
                got, " rows to this rank (group rank ", rank_, "), which expects out_splits ", out_splits);
    }
    si.load();
    const MPI_Datatype dt = mpi::datatype(si.buf.dtype());
    mpi::check(MPI_Alltoallv(si.data(), sc.data(), sd.data(), dt, so.data(), rc.data(), rd.data(), dt, comm_),
               "MPI_Alltoallv", what);
    so.store();
  });
}

WorkPtr MpiProcessGroup::send(const Tensor& t, int dst, int tag) {
  const std::string what = detail::cat("send(", desc(t), ", dst ", dst, ", tag ", tag, ")");
  DTR_CHECK(dst >= 0 && dst < size_ && dst != rank_, what, " on group ", name_, ": dst must be another rank in [0, ",
            size_, "), this rank is ", rank_);
  counters_.add(CommKind::send, static_cast<int64_t>(t.nbytes()));
  auto st = std::make_shared<P2pState>(t);
  const int64_t n = t.numel();
  WorkPtr posted = enqueue(CommKind::send, what, [this, st, n, dst, tag, what]() {
    std::lock_guard<std::mutex> lk(st->mu);
    st->staged.load();
    mpi::check(MPI_Isend(st->staged.data(), mpi::count(n, what), mpi::datatype(st->staged.buf.dtype()), dst, tag,
                         comm_, &st->req),
               "MPI_Isend", what);
  });
  return std::make_shared<P2pWork>(posted, st, what, name_);
}

WorkPtr MpiProcessGroup::recv(Tensor& t, int src, int tag) {
  const std::string what = detail::cat("recv(", desc(t), ", src ", src, ", tag ", tag, ")");
  DTR_CHECK(src >= 0 && src < size_ && src != rank_, what, " on group ", name_, ": src must be another rank in [0, ",
            size_, "), this rank is ", rank_);
  counters_.add(CommKind::recv, static_cast<int64_t>(t.nbytes()));
  t.bump_version();
  auto st = std::make_shared<P2pState>(t);
  st->copy_back = true;
  const int64_t n = t.numel();
  WorkPtr posted = enqueue(CommKind::recv, what, [this, st, n, src, tag, what]() {
    std::lock_guard<std::mutex> lk(st->mu);
    mpi::check(MPI_Irecv(st->staged.data(), mpi::count(n, what), mpi::datatype(st->staged.buf.dtype()), src, tag,
                         comm_, &st->req),
               "MPI_Irecv", what);
  });
  return std::make_shared<P2pWork>(posted, st, what, name_);
}

WorkPtr MpiProcessGroup::barrier() {
  const std::string what = "barrier()";
  counters_.add(CommKind::barrier, 0);
  if (size_ == 1) return QueuedWork::completed(what, name_);
  return enqueue(CommKind::barrier, what, [this, what]() {
    if (comm_debug()) check_signature(what, {int64_t(CommKind::barrier), 0, 0, 0, -1});
    wait_for_peers(what);  // the barrier itself, without spinning
  });
}

}  // namespace dtr
