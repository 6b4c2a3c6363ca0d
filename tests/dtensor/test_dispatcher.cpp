// The dispatcher's handling of strided shards (FSDP + TP parameters, [StridedShard(0, tp),
// Shard(0)] on a dp x tp mesh, and strided shards alone on a 1-d mesh): every op with a sharding
// rule accepts them and equals the single process, forward and backward. Reductions (a weight
// norm for logging), pointwise ops, transposes and views place them without communication;
// other rules see them as Replicate and the dispatcher redistributes (one dp all_gather for the
// FSDP + TP pair). Before, a reduction segfaulted, views and some ops gave wrong shapes or values,
// and redistribute refused most targets. A plain leaf mixed with DTensors gets a plain gradient.
#include "dtensor/comm_debug.h"
#include "dtensor_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
Tensor rnd(const Shape& s) { return uniform(s, -1, 1, TensorOptions(DType::f64)); }
using V = std::vector<Tensor>;

/// The strided layouts this world size has: the FSDP + TP pair on a 2 x (w/2) mesh, and a lone
/// StridedShard(0, 2) / (1, 3) on the world mesh.
std::vector<std::pair<DeviceMesh, Placements>> strided_layouts() {
  std::vector<std::pair<DeviceMesh, Placements>> out;
  DeviceMesh world = DeviceMesh::world("w");
  out.push_back({world, {StridedShard(0, 2)}});
  out.push_back({world, {StridedShard(1, 3)}});
  const int w = world_size();
  if (w >= 2 && w % 2 == 0) {
    DeviceMesh m({2, w / 2}, {"dp", "tp"});
    out.push_back({m, {StridedShard(0, w / 2), Shard(0)}});
    out.push_back({m, {StridedShard(1, w / 2), Shard(1)}});
  }
  return out;
}

/// f on a weight placed by every strided layout (other inputs Replicate) equals the single process.
void check_strided(const std::function<Tensor(const V&)>& f, const std::vector<Tensor>& fulls) {
  for (const auto& [mesh, pl] : strided_layouts()) {
    std::vector<Placements> pls{pl};
    for (size_t i = 1; i < fulls.size(); ++i) pls.push_back(replicate_all(mesh.ndim()));
    const std::string r = compare_with_single(f, fulls, mesh, pls);
    INFO(r);
    CHECK(r.empty());
  }
}
}  // namespace

TEST_CASE("reductions over strided parameters equal the single process", "[dispatcher][strided]") {
  manual_seed(71);
  for (const Shape& sh : {Shape{8, 4}, Shape{7, 3}, Shape{3, 2}}) {  // even, uneven, empty shards
    Tensor w = rnd(sh);
    check_strided([](const V& v) { return sum(v[0]); }, {w});
    check_strided([](const V& v) { return sum(v[0], {0}); }, {w});
    check_strided([](const V& v) { return sum(v[0], {1}, true); }, {w});
    check_strided([](const V& v) { return mean(v[0]); }, {w});
    check_strided([](const V& v) { return sqrt(sum(mul(v[0], v[0]))); }, {w});  // a weight norm
    check_strided([](const V& v) { return amax(v[0]); }, {w});
    check_strided([](const V& v) { return amax(v[0], {1}); }, {w});
    check_strided([](const V& v) { return max(v[0], 0).first; }, {w});
    check_strided([](const V& v) { return max(v[0], 1).first; }, {w});
  }
}

TEST_CASE("pointwise, matrix, view and nn ops on strided parameters equal the single process",
          "[dispatcher][strided]") {
  manual_seed(72);
  for (const Shape& sh : {Shape{8, 4}, Shape{7, 3}}) {
    Tensor w = rnd(sh);
    check_strided([](const V& v) { return exp(v[0]); }, {w});
    check_strided([](const V& v) { return add(v[0], v[0]); }, {w});
    check_strided([](const V& v) { return mul(v[0], v[1]); }, {w, rnd(sh)});
    check_strided([](const V& v) { return add(v[0], v[1]); }, {w, rnd({sh[1]})});       // broadcast
    check_strided([](const V& v) { return sub(v[1], v[0]); }, {w, rnd({sh[0], 1})});    // broadcast on dim 1
    check_strided([](const V& v) { return mm(v[0], v[1]); }, {w, rnd({sh[1], 5})});
    check_strided([](const V& v) { return mm(v[1], v[0]); }, {w, rnd({5, sh[0]})});
    check_strided([](const V& v) { return linear(v[1], v[0]); }, {w, rnd({5, sh[1]})});  // colwise weight
    check_strided([](const V& v) { return transpose(v[0], 0, 1); }, {w});
    check_strided([](const V& v) { return unsqueeze(v[0], 0); }, {w});
    check_strided([sh](const V& v) { return reshape(v[0], {sh[0] * sh[1]}); }, {w});
    check_strided([](const V& v) { return softmax(v[0], 1); }, {w});
    check_strided([](const V& v) { return narrow(v[0], 0, 1, 2); }, {w});
    check_strided([](const V& v) { return rms_norm(v[0], v[1], 1e-6); }, {w, rnd({sh[1]})});
    check_strided([](const V& v) { return cross_entropy(v[0], v[1]); },
                  {w, from_vector<int64_t>(std::vector<int64_t>(sh[0], 1), {sh[0]})});
    check_strided([](const V& v) { return embedding(v[1], v[0]); }, {w, from_vector<int64_t>({0, 2, 1, 2}, {2, 2})});
  }
}

TEST_CASE("a weight norm of an FSDP + TP parameter on a 2 x 2 mesh is the single-process number",
          "[dispatcher][strided]") {
  if (world_size() != 4) return;
  manual_seed(73);
  DeviceMesh mesh({2, 2}, {"dp", "tp"});
  Tensor full = rnd({11, 5});
  Tensor w = distribute_tensor(full, mesh, {StridedShard(0, 2), Shard(0)});
  CommDebugMode m;
  Tensor sq = sum(mul(w, w));  // local: Partial on both mesh dims
  CHECK(m.total() == 0);
  CHECK(placements(sq) == Placements{Partial(), Partial()});
  const double norm = std::sqrt(full_tensor(sq).item<double>());
  CHECK(std::abs(norm - std::sqrt(sum(mul(full, full)).item<double>())) < kDistTol);
  // A rule without a strided strategy (mm) redistributes the parameter with one dp all_gather.
  CommDebugMode m2;
  Tensor y = mm(w, distribute_tensor(rnd({5, 2}), mesh, {Replicate(), Replicate()}));
  CHECK(m2.count(CommKind::all_gather) == 1);
  CHECK(placements(y) == Placements{Replicate(), Shard(0)});
}

TEST_CASE("a plain tensor used with DTensors gets its full gradient as a plain tensor", "[dispatcher][grad]") {
  // A plain operand counts as replicated; its gradient is the single-process one, plain. Before,
  // .grad held a DTensor (Partial, or sharded like the other operand), found by test_property.
  manual_seed(74);
  Tensor xf = rnd({5, 3}), bf = rnd({3});
  Tensor ref_b = bf.clone().set_requires_grad(true);
  sum(mul(add(xf, ref_b), xf)).backward();
  for (const DeviceMesh& mesh : test_meshes())
    for (const auto& p : all_placements(mesh, 2, true)) {
      INFO(placements_str(p) << " on " << mesh.str());
      Tensor x = make_input(xf, mesh, p);
      Tensor b = bf.clone().set_requires_grad(true);
      sum(mul(add(x, b), x)).backward();
      REQUIRE(b.grad().defined());
      CHECK_FALSE(b.grad().is_distributed());
      CHECK(max_abs_diff(b.grad(), ref_b.grad()) < kDistTol);
    }
}
