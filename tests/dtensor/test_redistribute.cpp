// Redistribute round trips for every pair of placements on 1-d and 2-d meshes (strided shards
// included), with uneven sizes and empty shards, the collectives each transition issues, and the
// transition table's comm bytes against the process-group counters.
#include "dtensor/comm_debug.h"
#include "dtensor_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Tensor pattern(const Shape& s) {
  return reshape(arange(0, static_cast<double>(shape_numel(s)), 1, TensorOptions(DType::f64)), s);
}
}  // namespace

TEST_CASE("redistribute between every pair of placements equals slicing the full tensor", "[redistribute]") {
  for (const DeviceMesh& mesh : test_meshes()) {
    // Uneven: 5 rows / 3 cols do not divide 2, 3 or 4; size 1 gives empty shards.
    for (const Shape& shape : {Shape{5, 3}, Shape{1, 7}, Shape{4, 4}}) {
      Tensor full = pattern(shape);
      const auto all = all_placements(mesh, 2, true);
      for (const auto& from : all) {
        Tensor x = make_input(full, mesh, from);
        for (const auto& to : all) {
          bool shard_to_partial = false;
          for (int i = 0; i < mesh.ndim(); ++i)
            if (from[i].is_shard() && to[i].is_partial()) shard_to_partial = true;
          INFO("mesh " << mesh.str() << " shape " << ::dtr::detail::cat(shape) << " from " << placements_str(from) << " to "
                       << placements_str(to));
          if (shard_to_partial) {
            CHECK_THROWS_WITH(redistribute(x, to), Catch::Contains("not supported"));
            continue;
          }
          Tensor y = redistribute(x, to);
          CHECK(placements(y) == to);
          CHECK(y.sizes() == shape);
          CHECK(max_abs_diff(full_tensor(y), full) < 1e-12);
          if (!dtensor_spec(y).has_partial()) {
            // The local shard equals the slice of the full tensor at this rank's offsets.
            Tensor expect = local_tensor(distribute_tensor(full, mesh, to, std::nullopt));
            CHECK(local_tensor(y).sizes() == expect.sizes());
            CHECK(max_abs_diff(local_tensor(y), expect) < 1e-12);
          }
        }
      }
    }
  }
}

TEST_CASE("transitions issue the expected collectives", "[redistribute][comm]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  if (mesh.size() == 1) return;
  Tensor full = pattern({6, 5});
  {
    Tensor x = make_input(full, mesh, {Partial()});
    CommDebugMode m;
    Tensor y = redistribute(x, {Shard(0)});
    CHECK(m.count(CommKind::reduce_scatter) == 1);
    CHECK(m.total() == 1);
  }
  {
    Tensor x = make_input(full, mesh, {Shard(0)});
    CommDebugMode m;
    Tensor y = redistribute(x, {Shard(1)});
    CHECK(m.count(CommKind::all_to_all) == 1);
    CHECK(m.total() == 1);
    CHECK(max_abs_diff(full_tensor(y), full) == 0);
  }
  {
    Tensor x = make_input(full, mesh, {Replicate()});
    CommDebugMode m;
    Tensor y = redistribute(x, {Shard(1)});
    Tensor z = redistribute(x, {Partial()});
    CHECK(m.total() == 0);
    CHECK(max_abs_diff(full_tensor(z), full) < 1e-12);
  }
  {
    Tensor x = make_input(full, mesh, {Shard(0)});
    CommDebugMode m;
    full_tensor(x);
    CHECK(m.count(CommKind::all_gather) == 1);
  }
}

TEST_CASE("redistribute is differentiable with PyTorch's backward placements", "[redistribute][grad]") {
  for (const DeviceMesh& mesh : test_meshes()) {
    Tensor full = pattern({5, 3});
    for (const auto& from : all_placements(mesh, 2, false))
      for (const auto& to : all_placements(mesh, 2, true)) {
        bool shard_to_partial = false;
        for (int i = 0; i < mesh.ndim(); ++i)
          if (from[i].is_shard() && to[i].is_partial()) shard_to_partial = true;
        if (shard_to_partial) continue;
        INFO("from " << placements_str(from) << " to " << placements_str(to));
        const std::string r = compare_with_single(
            [to](const std::vector<Tensor>& v) {
              return v[0].is_distributed() ? redistribute(mul(v[0], v[0]), to) : mul(v[0], v[0]);
            },
            {full}, mesh, {from});
        CHECK(r == "");
      }
  }
}

TEST_CASE("bad redistribute input raises a clear error", "[redistribute][errors]") {
  DeviceMesh mesh = DeviceMesh::world("w");
  Tensor x = distribute_tensor(pattern({4, 2}), mesh, {Shard(0)});
  CHECK_THROWS_WITH(redistribute(x, {Shard(0), Replicate()}), Catch::Contains("2 placements"));
  CHECK_THROWS_WITH(redistribute(x, {Shard(2)}), Catch::Contains("Shard(2)"));
  if (mesh.size() > 1) CHECK_THROWS_WITH(redistribute(x, {Partial()}), Catch::Contains("not supported"));
}

TEST_CASE("strided shard (FSDP + TP on one dim) keeps rows in the right order", "[redistribute][strided]") {
  const int w = world_size();
  if (w == 4) {
    // [8, 8] on dp x tp 2 x 2 with [_StridedShard(0, 2), Shard(0)]: ranks (0,0), (0,1), (1,0),
    // (1,1) hold rows 0-1, 4-5, 2-3, 6-7 (PyTorch's FSDP + TP layout).
    DeviceMesh mesh({2, 2}, {"dp", "tp"});
    Tensor full = pattern({8, 8});
    Tensor x = distribute_tensor(full, mesh, {StridedShard(0, 2), Shard(0)});
    const int64_t first_row[4] = {0, 4, 2, 6};
    Tensor expect = full.narrow(0, first_row[rank()], 2);
    CHECK(max_abs_diff(local_tensor(x), expect) == 0);
    CHECK(dtensor_spec(x).local_offset()[0] == first_row[rank()]);  // one contiguous range
    CHECK(max_abs_diff(full_tensor(x), full) == 0);
    // Uneven rows, and back to a plain shard. Rank (d, t) holds dp chunk d of TP block t.
    Tensor u = pattern({7, 3});
    Tensor y = distribute_tensor(u, mesh, {StridedShard(0, 2), Shard(0)});
    const Chunk block = chunk_of(7, 2, mesh.coordinate(1)), piece = chunk_of(block.size, 2, mesh.coordinate(0));
    CHECK(max_abs_diff(local_tensor(y), u.narrow(0, block.offset + piece.offset, piece.size)) == 0);
    CHECK(max_abs_diff(full_tensor(y), u) == 0);
    Tensor z = redistribute(y, {Replicate(), Shard(0)});
    CHECK(max_abs_diff(full_tensor(z), u) == 0);
    CHECK(max_abs_diff(local_tensor(z), local_tensor(distribute_tensor(u, mesh, {Replicate(), Shard(0)}))) == 0);
  }
  for (const Shape& shape : {Shape{5, 2}, Shape{9, 4}}) {
    DeviceMesh mesh = DeviceMesh::world("w");
    Tensor full = pattern(shape);
    Tensor x = distribute_tensor(full, mesh, {StridedShard(0, 3)});
    CHECK(max_abs_diff(full_tensor(x), full) == 0);
    Tensor y = redistribute(x, {Shard(1)});  // raised "a strided shard can only become Replicate" before
    CHECK(max_abs_diff(local_tensor(y), local_tensor(distribute_tensor(full, mesh, {Shard(1)}))) == 0);
  }
}

TEST_CASE("strided shards redistribute to and from every placement", "[redistribute][strided]") {
  // Every pair of placement lists over {Replicate, Shard(0), Shard(1), StridedShard(0, 2),
  // StridedShard(1, 3)} plus the FSDP + TP pairs
  // [StridedShard(d, n1), Shard(d)] on 2-d meshes: the local shard after redistribute equals the
  // one distribute_tensor makes, and the value survives. Uneven sizes (5 x 3) and empty shards.
  for (const DeviceMesh& mesh : test_meshes()) {
    std::vector<Placements> lists = all_placements(mesh, 2, false, true);
    if (mesh.ndim() == 2)
      for (int64_t d : {0, 1}) lists.push_back({StridedShard(d, mesh.size(1)), Shard(d)});
    Tensor full = pattern({5, 3});
    for (const auto& from : lists)
      for (const auto& to : lists) {
        INFO("from " << placements_str(from) << " to " << placements_str(to) << " on " << mesh.str());
        Tensor x = distribute_tensor(full, mesh, from);
        Tensor y = redistribute(x, to);
        CHECK(max_abs_diff(local_tensor(y), local_tensor(distribute_tensor(full, mesh, to))) == 0);
        CHECK(max_abs_diff(full_tensor(y), full) == 0);
      }
  }
}

TEST_CASE("a FSDP + TP strided parameter reaches [Replicate, Shard] with one dp all_gather", "[redistribute][strided]") {
  if (world_size() != 4) return;
  DeviceMesh mesh({2, 2}, {"dp", "tp"});
  Tensor full = pattern({7, 3});
  Tensor x = distribute_tensor(full, mesh, {StridedShard(0, 2), Shard(0)});
  CommDebugMode m;
  Tensor y = redistribute(x, {Replicate(), Shard(0)});
  CHECK(m.count(CommKind::all_gather) == 1);
  CHECK(m.total() == 1);
  CHECK(max_abs_diff(local_tensor(y), local_tensor(distribute_tensor(full, mesh, {Replicate(), Shard(0)}))) == 0);
  CommDebugMode back;
  Tensor z = redistribute(y, {StridedShard(0, 2), Shard(0)});  // the FSDP gradient path: local only
  CHECK(back.total() == 0);
  CHECK(max_abs_diff(local_tensor(z), local_tensor(x)) == 0);
}

TEST_CASE("the table's comm bytes of every transition equal the process-group counters", "[redistribute][comm]") {
  // Every pair of placement lists over {Replicate, Shard(0), Shard(1), Partial, StridedShard(0, 2),
  // StridedShard(1, 3)} (plus the FSDP + TP pairs on 2-d meshes), uneven sizes and empty shards:
  // redistribute_comm (the plan's entries, not run) names the same calls and bytes per mesh dim
  // and kind as the groups' CommCounters count when redistribute runs the plan.
  for (const DeviceMesh& mesh : test_meshes()) {
    std::vector<Placements> lists = all_placements(mesh, 2, true, true);
    if (mesh.ndim() == 2)
      for (int64_t d : {0, 1}) lists.push_back({StridedShard(d, mesh.size(1)), Shard(d)});
    for (const Shape& shape : {Shape{5, 3}, Shape{1, 7}}) {
      Tensor full = pattern(shape);
      for (const auto& from : lists) {
        Tensor x = make_input(full, mesh, from);
        for (const auto& to : lists) {
          bool shard_to_partial = false;
          for (int i = 0; i < mesh.ndim(); ++i)
            if (from[i].shards() && to[i].is_partial()) shard_to_partial = true;
          if (shard_to_partial) continue;
          INFO("mesh " << mesh.str() << " shape " << ::dtr::detail::cat(shape) << " from " << placements_str(from) << " to "
                       << placements_str(to));
          std::vector<std::array<int64_t, kNumCommKinds>> calls(mesh.ndim(), std::array<int64_t, kNumCommKinds>{}),
              bytes(calls);
          for (const RedistributeComm& c : redistribute_comm(dtensor_spec(x), to)) {
            calls[c.mesh_dim][static_cast<int>(c.kind)] += 1;
            bytes[c.mesh_dim][static_cast<int>(c.kind)] += c.bytes;
          }
          for (int i = 0; i < mesh.ndim(); ++i) mesh.group(i)->counters().reset();
          Tensor y = redistribute(x, to);
          for (int i = 0; i < mesh.ndim(); ++i)
            for (int k = 0; k < kNumCommKinds; ++k) {
              INFO("mesh dim " << i << " " << comm_kind_name(static_cast<CommKind>(k)));
              const CommCounters& cnt = mesh.group(i)->counters();
              CHECK(cnt.count(static_cast<CommKind>(k)) == calls[i][k]);
              CHECK(cnt.nbytes(static_cast<CommKind>(k)) == bytes[i][k]);
            }
          CHECK(max_abs_diff(full_tensor(y), full) < 1e-12);
        }
      }
    }
  }
}
