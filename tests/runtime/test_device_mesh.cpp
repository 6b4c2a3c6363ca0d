// DeviceMesh: row-major layout, one group per dim (a collective on "tp" touches only tp peers),
// sub-meshes sharing groups, flatten, coordinates, and the errors. Runs on 1, 2, 3, 4 and 6
// ranks, and without mpirun (world size 1).
#include <catch2/catch.hpp>

#include <numeric>

#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

/// Sum over `g`'s members of (world rank + 1), by all_reduce on g; checked against the group's
/// rank list, which the test also checks against the expected layout.
void check_group_sum(ProcessGroup& g) {
  Tensor t = full({16}, dtr::rank() + 1.0, DType::f64);
  const int64_t before = g.counters().count(CommKind::all_reduce);
  g.all_reduce(t)->wait();
  CHECK(g.counters().count(CommKind::all_reduce) == before + 1);
  double expect = 0;
  for (int r : g.ranks()) expect += r + 1;
  CHECK(mismatches(t, [&](int64_t) { return expect; }) == 0);
}

/// World ranks of the row-major grid `shape` whose coordinates equal `me`'s outside `dims`.
std::vector<int> expected_ranks(const Shape& shape, const std::vector<int>& dims) {
  const int world = dtr::world_size(), me = dtr::rank();
  auto coord = [&](int r) {
    std::vector<int64_t> c(shape.size());
    for (size_t d = shape.size(); d-- > 0;) {
      c[d] = r % shape[d];
      r /= static_cast<int>(shape[d]);
    }
    return c;
  };
  const auto mine = coord(me);
  std::vector<int> out;
  for (int r = 0; r < world; ++r) {
    auto c = coord(r);
    bool same = true;
    for (size_t d = 0; d < shape.size(); ++d)
      if (std::find(dims.begin(), dims.end(), static_cast<int>(d)) == dims.end()) same &= c[d] == mine[d];
    if (same) out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("1-d world mesh", "[device_mesh]") {
  const int world = dtr::world_size(), me = dtr::rank();
  DeviceMesh m = DeviceMesh::world("dp");
  CHECK(m.ndim() == 1);
  CHECK(m.size() == world);
  CHECK(m.size("dp") == world);
  CHECK(m.get_coordinate() == std::vector<int64_t>{me});
  std::vector<int> all(world);
  std::iota(all.begin(), all.end(), 0);
  CHECK(m.ranks() == all);
  CHECK(m.group("dp")->ranks() == all);
  CHECK(m.group(0)->rank() == me);
  check_group_sum(*m.group("dp"));
}

TEST_CASE("2-d meshes: groups per dim, sub-meshes, flatten", "[device_mesh]") {
  const int world = dtr::world_size(), me = dtr::rank();
  std::vector<Shape> shapes = {{1, world}, {world, 1}};
  if (world == 4) shapes.push_back({2, 2});
  if (world == 6) shapes.push_back({2, 3}), shapes.push_back({3, 2});
  for (const Shape& shape : shapes) {
    INFO("mesh " << detail::cat(shape));
    DeviceMesh m(shape, {"dp", "tp"});
    CHECK(m.get_coordinate() == std::vector<int64_t>{me / shape[1], me % shape[1]});
    CHECK(m.group("tp")->ranks() == expected_ranks(shape, {1}));
    CHECK(m.group("dp")->ranks() == expected_ranks(shape, {0}));
    CHECK(m.group("tp")->size() == shape[1]);
    CHECK(m.group("tp")->rank() == me % shape[1]);
    // A collective on tp touches only tp peers: its sum is over tp ranks; dp's counters are untouched.
    m.group("dp")->counters().reset();
    check_group_sum(*m.group("tp"));
    CHECK(m.group("dp")->counters().count(CommKind::all_reduce) == 0);
    check_group_sum(*m.group("dp"));
    // Sub-meshes share the groups.
    DeviceMesh tp = m["tp"];
    CHECK(tp.ndim() == 1);
    CHECK(tp.size() == shape[1]);
    CHECK(tp.ranks() == expected_ranks(shape, {1}));
    CHECK(tp.group(0).get() == m.group("tp").get());
    CHECK(tp.get_coordinate() == std::vector<int64_t>{me % shape[1]});
    CHECK(m[{"dp", "tp"}] == m);
    // Flattened dim over both: a group of the whole world.
    m.flatten({"dp", "tp"}, "dp_tp");
    DeviceMesh flat = m["dp_tp"];
    CHECK(flat.size() == world);
    CHECK(flat.get_coordinate() == std::vector<int64_t>{me});
    CHECK(flat.group(0)->size() == world);
    check_group_sum(*flat.group(0));
    m.flatten({"dp", "tp"}, "dp_tp");  // same again: no-op
    CHECK(m["dp_tp"].group(0).get() == flat.group(0).get());
  }
}

TEST_CASE("3-d mesh: sub-mesh over two dims and flatten dp_shard x cp", "[device_mesh]") {
  const int world = dtr::world_size(), me = dtr::rank();
  Shape shape = {1, world, 1};
  if (world == 4) shape = {1, 2, 2};
  if (world == 6) shape = {1, 3, 2};
  INFO("mesh " << detail::cat(shape));
  DeviceMesh m(shape, {"dp_replicate", "dp_shard", "cp"});
  DeviceMesh dp = m[{"dp_replicate", "dp_shard"}];
  CHECK(dp.ndim() == 2);
  CHECK(dp.shape() == Shape{shape[0], shape[1]});
  CHECK(dp.ranks() == expected_ranks(shape, {0, 1}));
  CHECK(dp.group("dp_shard").get() == m.group("dp_shard").get());
  m.flatten({"dp_shard", "cp"}, "dp_shard_cp");
  DeviceMesh sc = m["dp_shard_cp"];
  CHECK(sc.size() == shape[1] * shape[2]);
  CHECK(sc.ranks() == expected_ranks(shape, {1, 2}));
  CHECK(sc.group(0)->ranks() == expected_ranks(shape, {1, 2}));
  CHECK(sc.get_coordinate() == std::vector<int64_t>{me % (shape[1] * shape[2])});
  check_group_sum(*sc.group(0));
  // A mixed sub-mesh of a plain and a flattened dim.
  DeviceMesh mixed = m[{"dp_replicate", "dp_shard_cp"}];
  CHECK(mixed.shape() == Shape{shape[0], shape[1] * shape[2]});
  CHECK(mixed.group(1).get() == sc.group(0).get());
  // root_mesh: every dim of the constructed mesh, from any sub-mesh; its flattened dims too.
  DeviceMesh root = m["cp"].root_mesh();
  CHECK(root == m);
  CHECK(root.group(1).get() == m.group(1).get());
  CHECK(root[{"dp_shard_cp"}] == sc);
  CHECK(dp.shares_root(m["cp"]));
  CHECK(!dp.shares_root(DeviceMesh(shape, {"dp_replicate", "dp_shard", "cp"})));
}

TEST_CASE("mesh errors name sizes, names and world size", "[device_mesh]") {
  const int world = dtr::world_size();
  CHECK_THROWS_WITH(DeviceMesh({world + 1}, {"dp"}),
                    Catch::Contains("product of the sizes is " + std::to_string(world + 1)) &&
                        Catch::Contains("world size is " + std::to_string(world)) && Catch::Contains("dp"));
  CHECK_THROWS_WITH(DeviceMesh({world, 1}, {"tp", "tp"}), Catch::Contains("duplicate dim name 'tp'"));
  CHECK_THROWS_WITH(DeviceMesh({world}, {"a", "b"}), Catch::Contains("1 sizes but 2 names"));
  // 7 x 7905747460161236407 = 1 (mod 2^64): the wrapped product passed the world-size check.
  CHECK_THROWS_WITH(DeviceMesh({7, 7905747460161236407, world}, {"a", "b", "c"}), Catch::Contains("overflows int64"));
  DeviceMesh m({1, world, 1}, {"a", "b", "c"});
  CHECK_THROWS_WITH(m["tp"], Catch::Contains("unknown dim name 'tp'") && Catch::Contains("a, b, c"));
  CHECK_THROWS_WITH(m.size("x"), Catch::Contains("unknown dim name 'x'"));
  CHECK_THROWS_WITH((m[{"b", "a"}]), Catch::Contains("mesh order"));
  CHECK_THROWS_WITH((m[{"a", "a"}]), Catch::Contains("duplicate dim name 'a'"));
  CHECK_THROWS_WITH(m.flatten({"a", "c"}, "ac"), Catch::Contains("adjacent"));
  CHECK_THROWS_WITH(m.flatten({"a", "b"}, "c"), Catch::Contains("already a mesh dim"));
}
