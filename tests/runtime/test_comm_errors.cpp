// Errors of MpiProcessGroup: shape checks at issue time, integer AVG, the DTR_COMM_DEBUG
// cross-rank check (mismatched numel / dtype / kind), and the group staying usable afterwards.
#include <catch2/catch.hpp>

#include "runtime/mpi_process_group.h"
#include "test_util.h"

using namespace dtr;
using namespace dtr::testing;

TEST_CASE("shape checks name the collective, shapes and group", "[comm_errors]") {
  auto pg = MpiProcessGroup::world("world");
  const int size = pg->size();
  Tensor in = zeros({4, 3}), bad = zeros({4 * size + 1, 3});
  CHECK_THROWS_WITH(pg->all_gather(bad, in), Catch::Contains("all_gather") && Catch::Contains("[4, 3]") &&
                                                 Catch::Contains("world") && Catch::Contains("group size"));
  Tensor rs_out = zeros({5, 3});
  CHECK_THROWS_WITH(pg->reduce_scatter(rs_out, in), Catch::Contains("reduce_scatter") && Catch::Contains("[5, 3]"));
  Tensor f64 = zeros({4, 3}, DType::f64);
  CHECK_THROWS_WITH(pg->all_to_all(f64, in), Catch::Contains("all_to_all") && Catch::Contains("dtypes differ"));
  Tensor a2a_out = zeros({size + 1, 3}), a2a_in = zeros({size, 3});
  std::vector<int64_t> ones(size, 1);
  CHECK_THROWS_WITH(pg->all_to_all(a2a_out, a2a_in, ones, ones), Catch::Contains("splits must sum"));
  CHECK_THROWS_WITH(pg->broadcast(in, size), Catch::Contains("broadcast") && Catch::Contains("root"));
  Tensor ints = zeros({3}, DType::i64);
  CHECK_THROWS_WITH(pg->all_reduce(ints, ReduceOp::AVG),
                    Catch::Contains("all_reduce(avg") && Catch::Contains("AVG needs a floating dtype") &&
                        Catch::Contains("int64"));
}

TEST_CASE("debug mode reports mismatched sizes and dtypes on all ranks", "[comm_errors]") {
  auto pg = MpiProcessGroup::world("world");
  const int me = pg->rank(), size = pg->size();
  if (size == 1) return;
  set_comm_debug(true);
  {
    Tensor t = zeros({me == 0 ? 4 : 5});
    WorkPtr w = pg->all_reduce(t);
    CHECK_THROWS_WITH(w->wait(), Catch::Contains("all_reduce") && Catch::Contains("ranks disagree") &&
                                     Catch::Contains("numel 4") && Catch::Contains("numel 5") &&
                                     Catch::Contains("group world"));
  }
  {
    Tensor t = zeros({6}, me == 1 ? DType::bf16 : DType::f32);
    WorkPtr w = pg->broadcast(t, 0);
    CHECK_THROWS_WITH(w->wait(), Catch::Contains("broadcast") && Catch::Contains("bfloat16") &&
                                     Catch::Contains("float32"));
  }
  {
    // Different collectives on different ranks.
    Tensor t = zeros({size * 2}), o = zeros({2});
    WorkPtr w = me == 0 ? pg->all_reduce(t) : pg->reduce_scatter(o, t);
    CHECK_THROWS_WITH(w->wait(), Catch::Contains("all_reduce") && Catch::Contains("reduce_scatter"));
  }
  {
    // all_to_all with splits that do not match across ranks.
    std::vector<int64_t> in_splits(size, 1), out_splits(size, 1);
    if (me == 0) out_splits[1] = 2;
    int64_t out_rows = 0;
    for (auto s : out_splits) out_rows += s;
    Tensor in = zeros({size, 2}), out = zeros({out_rows, 2});
    WorkPtr w = pg->all_to_all(out, in, out_splits, in_splits);
    CHECK_THROWS_WITH(w->wait(), Catch::Contains("splits disagree"));
  }
  // The group is still in step after the errors.
  Tensor t = full({8}, me + 1.0);
  pg->all_reduce(t)->wait();
  CHECK(mismatches(t, [&](int64_t) { return size * (size + 1) / 2.0; }) == 0);
  set_comm_debug(false);
}

TEST_CASE("many groups with their own threads run concurrently", "[comm_errors]") {
  // Three groups over the same ranks, issued in different orders on different ranks: each group
  // has its own thread and communicator, so none blocks another (MPI_THREAD_MULTIPLE).
  std::vector<std::shared_ptr<MpiProcessGroup>> gs;
  for (int k = 0; k < 3; ++k) gs.push_back(MpiProcessGroup::world("g" + std::to_string(k)));
  const int me = gs[0]->rank(), size = gs[0]->size();
  std::vector<Tensor> ts;
  std::vector<WorkPtr> ws(3);
  for (int k = 0; k < 3; ++k) ts.push_back(full({1000}, k + me + 0.0, DType::f64));
  for (int j = 0; j < 3; ++j) {
    const int k = (me % 2) ? 2 - j : j;
    ws[k] = gs[k]->all_reduce(ts[k]);
  }
  for (int k = 0; k < 3; ++k) {
    ws[k]->wait();
    const double expect = k * size + size * (size - 1) / 2.0;
    CHECK(mismatches(ts[k], [&](int64_t) { return expect; }) == 0);
  }
}
