// Every collective of MpiProcessGroup x dtype x size (0, 1, odd, large) x (wait at once /
// issue all then wait), against references computed locally from the known per-rank inputs
// (element i of rank r = value(r, i)). Runs on 1, 2, 3 and 4 ranks.
#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "runtime/env.h"
#include "runtime/mpi_process_group.h"
#include "test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

/// CPU seconds of this process, all threads (getrusage user + system).
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sizes: empty, one element, odd, large. Large is 1<<20 elements for f32 and bf16 (the
// training dtypes) and 1<<18 for the others (still far above MPI's eager and segment sizes),
// which keeps the test near 20 s on 4 oversubscribed ranks.
const std::vector<int64_t> kSizes = {0, 1, 1031, int64_t(1) << 20};
int64_t sized(int64_t n, DType dt) {
  return n == (int64_t(1) << 20) && dt != DType::f32 && dt != DType::bf16 ? n >> 2 : n;
}

/// Rows per rank for collectives whose input holds size * n elements: the large case keeps the
/// whole input at ~1<<20 elements so the test stays fast on 4 ranks.
int64_t per_rank(int64_t n, int size) { return n >= (int64_t(1) << 18) ? n / size + 1 : n; }

/// One issued collective and how to check its result.
struct Case {
  std::string name;
  Tensor out;
  std::function<double(int64_t)> ref;
  WorkPtr work;
};

using ValueFn = double (*)(int, int64_t);

double reduce_ref(ReduceOp op, int size, ValueFn f, int64_t i) {
  double acc = f(0, i);
  for (int r = 1; r < size; ++r) {
    const double x = f(r, i);
    switch (op) {
      case ReduceOp::SUM:
      case ReduceOp::AVG: acc += x; break;
      case ReduceOp::MAX: acc = std::max(acc, x); break;
      case ReduceOp::MIN: acc = std::min(acc, x); break;
      case ReduceOp::PRODUCT: acc *= x; break;
    }
  }
  return op == ReduceOp::AVG ? acc / size : acc;
}

std::vector<ReduceOp> ops_for(DType dt) {
  std::vector<ReduceOp> ops = {ReduceOp::SUM, ReduceOp::MAX, ReduceOp::MIN, ReduceOp::PRODUCT};
  if (is_floating(dt)) ops.push_back(ReduceOp::AVG);
  return ops;
}

ValueFn input_fn(ReduceOp op) { return op == ReduceOp::PRODUCT ? pvalue : value; }

using Issue = std::function<std::vector<Case>(ProcessGroup&, DType, int64_t)>;

std::vector<Case> issue_all_reduce(ProcessGroup& pg, DType dt, int64_t n) {
  std::vector<Case> cs;
  const int me = pg.rank(), size = pg.size();
  for (ReduceOp op : ops_for(dt)) {
    auto f = input_fn(op);
    Tensor t = make({n}, dt, [&](int64_t i) { return f(me, i); });
    Case c{std::string("all_reduce ") + reduce_op_name(op), t, [=](int64_t i) { return reduce_ref(op, size, f, i); }, nullptr};
    c.work = pg.all_reduce(c.out, op);
    cs.push_back(c);
  }
  return cs;
}

std::vector<Case> issue_all_gather(ProcessGroup& pg, DType dt, int64_t n) {
  const int me = pg.rank(), size = pg.size();
  Tensor in = make({n}, dt, [&](int64_t i) { return value(me, i); });
  Case c{"all_gather", zeros({size * n}, dt), [=](int64_t k) { return value(int(k / n), k % n); }, nullptr};
  c.work = pg.all_gather(c.out, in);
  return {c};
}

std::vector<Case> issue_reduce_scatter(ProcessGroup& pg, DType dt, int64_t n) {
  std::vector<Case> cs;
  const int me = pg.rank(), size = pg.size();
  n = per_rank(n, size);
  for (ReduceOp op : ops_for(dt)) {
    auto f = input_fn(op);
    Tensor in = make({size * n}, dt, [&](int64_t k) { return f(me, k); });
    Case c{std::string("reduce_scatter ") + reduce_op_name(op), zeros({n}, dt),
           [=](int64_t i) { return reduce_ref(op, size, f, me * n + i); }, nullptr};
    c.work = pg.reduce_scatter(c.out, in, op);
    cs.push_back(c);
  }
  return cs;
}

std::vector<Case> issue_broadcast(ProcessGroup& pg, DType dt, int64_t n) {
  const int me = pg.rank(), root = pg.size() - 1;
  Case c{"broadcast", make({n}, dt, [&](int64_t i) { return value(me, i); }), [=](int64_t i) { return value(root, i); }, nullptr};
  c.work = pg.broadcast(c.out, root);
  return {c};
}

std::vector<Case> issue_all_to_all(ProcessGroup& pg, DType dt, int64_t n) {
  const int me = pg.rank(), size = pg.size();
  n = per_rank(n, size);
  Tensor in = make({size * n}, dt, [&](int64_t k) { return value(me, k); });
  // out chunk j = chunk `me` of rank j's input.
  Case c{"all_to_all", zeros({size * n}, dt), [=](int64_t k) { return value(int(k / n), me * n + k % n); }, nullptr};
  c.work = pg.all_to_all(c.out, in);
  return {c};
}

/// Rows rank r sends to rank j in the split all_to_all (0 included).
int64_t split_rows(int r, int j, int64_t n) { return (r + 2 * j) % 3 + (n > 1 ? n / 4 : 0); }

std::vector<Case> issue_all_to_all_v(ProcessGroup& pg, DType dt, int64_t n) {
  const int me = pg.rank(), size = pg.size();
  n = per_rank(n, size);
  const int64_t w = 3;  // row width
  std::vector<int64_t> in_splits(size), out_splits(size);
  int64_t in_rows = 0, out_rows = 0;
  for (int j = 0; j < size; ++j) {
    in_rows += in_splits[j] = split_rows(me, j, n);
    out_rows += out_splits[j] = split_rows(j, me, n);
  }
  Tensor in = make({in_rows, w}, dt, [&](int64_t k) { return value(me, k); });
  // Output element (row, col): find the source rank j and the row's offset in j's input.
  auto ref = [=](int64_t k) {
    int64_t row = k / w, col = k % w;
    for (int j = 0; j < size; ++j) {
      const int64_t rows = split_rows(j, me, n);
      if (row < rows) {
        int64_t off = 0;
        for (int t = 0; t < me; ++t) off += split_rows(j, t, n);
        return value(j, (off + row) * w + col);
      }
      row -= rows;
    }
    return -1000.0;
  };
  Case c{"all_to_all_v", zeros({out_rows, w}, dt), ref, nullptr};
  c.work = pg.all_to_all(c.out, in, out_splits, in_splits);
  return {c};
}

void run(const std::string& coll, const Issue& issue) {
  auto pg = MpiProcessGroup::world();
  for (bool async : {false, true}) {
    for (DType dt : kCommDTypes) {
      std::vector<Case> cases;
      for (int64_t n0 : kSizes) {
        const int64_t n = sized(n0, dt);
        for (Case& c : issue(*pg, dt, n)) {
          c.name += " n=" + std::to_string(n);
          if (!async) c.work->wait();
          cases.push_back(c);
        }
      }
      for (Case& c : cases) {
        c.work->wait();
        CHECK(c.work->is_completed());
        INFO(coll << ": " << c.name << " " << dtype_name(dt) << (async ? " async" : " sync") << " on "
                  << pg->size() << " ranks");
        CHECK(mismatches(c.out, c.ref) == 0);
      }
    }
  }
}

}  // namespace

TEST_CASE("all_reduce every op, dtype and size", "[collectives]") { run("all_reduce", issue_all_reduce); }
TEST_CASE("all_gather every dtype and size", "[collectives]") { run("all_gather", issue_all_gather); }
TEST_CASE("reduce_scatter every op, dtype and size", "[collectives]") { run("reduce_scatter", issue_reduce_scatter); }
TEST_CASE("broadcast every dtype and size", "[collectives]") { run("broadcast", issue_broadcast); }
TEST_CASE("all_to_all every dtype and size", "[collectives]") { run("all_to_all", issue_all_to_all); }
TEST_CASE("all_to_all with splits every dtype and size", "[collectives]") { run("all_to_all_v", issue_all_to_all_v); }

TEST_CASE("non-contiguous inputs and outputs are staged", "[collectives]") {
  auto pg = MpiProcessGroup::world();
  const int me = pg->rank(), size = pg->size();
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    // all_reduce on a transposed [5, 3] view of a [3, 5] tensor.
    Tensor base = make({3, 5}, dt, [&](int64_t i) { return value(me, i); });
    Tensor t = base.t();
    REQUIRE_FALSE(t.is_contiguous());
    pg->all_reduce(t, ReduceOp::SUM)->wait();
    CHECK(mismatches(base, [&](int64_t i) { return reduce_ref(ReduceOp::SUM, size, value, i); }) == 0);
    // all_gather of a column slice into a transposed output.
    Tensor wide = make({4, 2}, dt, [&](int64_t i) { return value(me, i); });
    Tensor in = wide.narrow(1, 1, 1);  // [4, 1], stride 2: elements value(me, 2k+1)
    Tensor out_base = zeros({1, 4 * size}, dt);
    Tensor out = out_base.t();  // [4 * size, 1], non-contiguous
    pg->all_gather(out, in)->wait();
    CHECK(mismatches(out_base, [&](int64_t k) { return value(int(k / 4), 2 * (k % 4) + 1); }) == 0);
    // reduce_scatter and all_to_all on 2-d shapes.
    Tensor rs_in = make({2 * size, 3}, dt, [&](int64_t k) { return value(me, k); });
    Tensor rs_out = zeros({3, 2}, dt).t();  // [2, 3] non-contiguous
    pg->reduce_scatter(rs_out, rs_in, ReduceOp::MAX)->wait();
    CHECK(mismatches(rs_out.contiguous(), [&](int64_t i) { return reduce_ref(ReduceOp::MAX, size, value, me * 6 + i); }) == 0);
  }
}

TEST_CASE("send and recv around a ring", "[collectives]") {
  auto pg = MpiProcessGroup::world();
  const int me = pg->rank(), size = pg->size();
  if (size == 1) {
    Tensor t = zeros({3});
    CHECK_THROWS_WITH(pg->send(t, 0), Catch::Contains("send") && Catch::Contains("dst must be another rank"));
    return;
  }
  for (DType dt : kCommDTypes) {
    for (int64_t n : {int64_t(0), int64_t(1031), int64_t(1) << 18}) {
      Tensor out = make({n}, dt, [&](int64_t i) { return value(me, i); });
      Tensor in_base = zeros({2, n}, dt);
      Tensor in = in_base.t().narrow(1, 1, 1).squeeze(1);  // non-contiguous [n], stride 2
      const int64_t before = pg->counters().nbytes(CommKind::send);
      WorkPtr s = pg->send(out, (me + 1) % size, 7);
      WorkPtr r = pg->recv(in, (me + size - 1) % size, 7);
      CHECK(pg->counters().nbytes(CommKind::send) - before == static_cast<int64_t>(out.nbytes()));
      r->wait();
      s->wait();
      CHECK(r->is_completed());
      const int src = (me + size - 1) % size;
      CHECK(mismatches(in, [&](int64_t i) { return value(src, i); }) == 0);
      CHECK(mismatches(in_base.narrow(0, 0, 1).squeeze(0), [](int64_t) { return 0.0; }) == 0);
    }
  }
}

TEST_CASE("calls on one group run in issue order", "[collectives]") {
  auto pg = MpiProcessGroup::world();
  const int me = pg->rank(), size = pg->size();
  // x_r = r + 1; SUM then PRODUCT gives S^size with S = size (size + 1) / 2, while the reverse
  // order would give size * size!. Issued without waiting in between.
  Tensor t = full({64}, me + 1.0, DType::f64);
  std::vector<WorkPtr> ws;
  ws.push_back(pg->all_reduce(t, ReduceOp::SUM));
  ws.push_back(pg->all_reduce(t, ReduceOp::PRODUCT));
  ws.push_back(pg->barrier());
  for (auto& w : ws) w->wait();
  const double expect = std::pow(size * (size + 1) / 2.0, size);
  CHECK(mismatches(t, [&](int64_t) { return expect; }) == 0);
}

TEST_CASE("byte counters count input bytes per kind", "[collectives]") {
  auto pg = MpiProcessGroup::world();
  const int size = pg->size();
  pg->counters().reset();
  Tensor a = zeros({100}, DType::f32), g = zeros({10 * size}, DType::bf16), in = zeros({10}, DType::bf16);
  pg->all_reduce(a)->wait();
  pg->all_reduce(a)->wait();
  pg->all_gather(g, in)->wait();
  pg->reduce_scatter(in, g)->wait();
  CHECK(pg->counters().count(CommKind::all_reduce) == 2);
  CHECK(pg->counters().nbytes(CommKind::all_reduce) == 800);
  CHECK(pg->counters().nbytes(CommKind::all_gather) == 20);
  CHECK(pg->counters().nbytes(CommKind::reduce_scatter) == 20 * size);
  CHECK(pg->counters().count(CommKind::broadcast) == 0);
}

TEST_CASE("an async all_reduce progresses while the caller computes", "[collectives][overlap]") {
  auto pg = MpiProcessGroup::world();
  const int size = pg->size();
  Tensor t = make({1 << 16}, DType::f32, [&](int64_t i) { return value(pg->rank(), i); });
  WorkPtr w = pg->all_reduce(t);
  // Local computation in chunks, never calling wait(): the communication thread must finish the
  // collective on its own. The chunk count is only a bound against an infinite loop.
  Tensor a = full({64, 64}, 0.5, DType::f64);
  constexpr int kMaxChunks = 200000;
  int chunk = 0;
  for (; chunk < kMaxChunks && !w->is_completed(); ++chunk) a = matmul(a, a) * 0.01 + 0.5;
  INFO("compute chunks before completion: " << chunk);
  CHECK(chunk < kMaxChunks);
  CHECK(w->is_completed());
  w->wait();
  CHECK(mismatches(t, [&](int64_t i) { return reduce_ref(ReduceOp::SUM, size, value, i); }) == 0);
}

TEST_CASE("a collective waiting for a late rank does not spin a core", "[collectives][overlap]") {
  // Every rank but 0 issues the all_gather 400 ms late. Rank 0's main thread blocks in wait()
  // (a condition variable) and its communication thread waits for the others to arrive: that
  // wait must sleep (MpiProcessGroup::wait_for_peers), not busy-poll a core as Open MPI's
  // blocking collectives do, so the process uses far less CPU than the wall time it waits.
  auto pg = MpiProcessGroup::world();
  const int me = pg->rank(), size = pg->size();
  if (size == 1) return;
  Tensor in = make({1 << 12}, DType::f32, [&](int64_t i) { return value(me, i); });
  Tensor out = zeros({size * (1 << 12)}, DType::f32);
  pg->barrier()->wait();
  if (me != 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const double cpu0 = process_cpu_seconds(), t0 = wall_seconds();
  pg->all_gather(out, in)->wait();
  const double cpu = process_cpu_seconds() - cpu0, wall = wall_seconds() - t0;
  CHECK(mismatches(out, [&](int64_t i) { return value(static_cast<int>(i >> 12), i & ((1 << 12) - 1)); }) == 0);
  if (me != 0) return;
  INFO("rank 0 waited " << wall << " s using " << cpu << " s of CPU");
  CHECK(wall > 0.3);
  CHECK(cpu < 0.1 * wall);
}
