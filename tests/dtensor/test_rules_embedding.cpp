// embedding sharding: ids sharded on any dim with a replicated weight, colwise (weight
// Shard(1)), vocab parallel (weight Shard(0): masked lookup -> Partial, exactly one all_reduce
// to Replicate; gradient Shard(0) computed locally), uneven vocab (7 rows over 2-4 ranks).
#include "nn_rules_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Tensor ids_tensor() { return from_vector<int64_t>({0, 6, 3, 3, 1, 5, 2, 6, 4, 0, 1, 1, 6, 2, 5}, {3, 5}); }
Fn emb() {
  return [](const std::vector<Tensor>& v) { return embedding(v[0], v[1]); };
}
}  // namespace

TEST_CASE("embedding over every placement of ids and weight", "[rules][embedding]") {
  manual_seed(71);
  Tensor w = rnd({7, 4});
  check_all(emb(), {ids_tensor(), w}, {any_placement(2, false), any_placement(2, false)});
  check_all(emb(), {ids_tensor(), w}, {replicated(), any_placement(2, true)});
}

TEST_CASE("vocab-parallel embedding: Partial output, one all_reduce, local Shard(0) gradient",
          "[rules][embedding][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  manual_seed(72);
  Tensor w = rnd({7, 4});
  Tensor ids = ids_tensor();
  Tensor dw = distribute_tensor(w, mesh, {Shard(0)}).set_requires_grad(true);
  Tensor out;
  {
    CommDebugMode m;
    out = embedding(ids, dw);
    CHECK(m.total() == 0);
  }
  if (mesh.size() > 1) CHECK(placements(out)[0].is_partial());
  {
    CommDebugMode m;
    Tensor r = redistribute(out, {Replicate()});
    if (mesh.size() > 1) CHECK(m.count(CommKind::all_reduce) == 1);
    CHECK(m.count(CommKind::all_reduce) <= 1);
    CHECK(m.total() == m.count(CommKind::all_reduce));
    CHECK(max_abs_diff(to_local(r), embedding(ids, w)) < kDistTol);
    Tensor g = rnd({3, 5, 4});
    CommDebugMode mb;
    sum(mul(r, distribute_tensor(g, mesh, {Replicate()}, std::nullopt))).backward();
    CHECK(mb.total() == 0);
    CHECK(placements(dw.grad())[0] == Shard(0));
    Tensor wr = w.detach().clone().set_requires_grad(true);
    sum(mul(embedding(ids, wr), g)).backward();
    CHECK(max_abs_diff(full_tensor(dw.grad()), wr.grad()) < kDistTol);
  }
}

TEST_CASE("embedding rejects out-of-range ids on a vocab-sharded weight", "[rules][embedding][errors]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor dw = distribute_tensor(rnd({7, 4}), mesh, {Shard(0)});
  CHECK_THROWS_WITH(embedding(from_vector<int64_t>({1, 7}, {2}), dw), Catch::Contains("out of range for vocab size 7"));
}
