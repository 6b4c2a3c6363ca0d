// FSDP + TP (fully_shard on a (dp_shard, tp) mesh over tensor-parallel DTensors) on the tiny
// model with uneven sizes (rows 11 / 7 / 5 split over dp and tp): 5 AdamW steps equal the
// single-process run; colwise weights are [StridedShard(0, tp), Shard(0)] and full_tensor gives
// the original rows back; the dp group's bytes per step equal the theoretical FSDP figure of the
// TP-local parameters; mismatched meshes are clear errors.
// Meshes: 1 rank 1x1; 2 ranks 2x1, 1x2; 3 ranks 3x1, 1x3; 4 ranks 2x2 and HSDP 2x1x2.
#include "gradcheck.h"
#include "parallel_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

/// f32 AdamW over 5 steps: FSDP + TP sums gradients in another order (TP partial products,
/// dp reduce-scatter); AdamW's 1/sqrt(v) passes ~1e-7 relative gradient differences on.
/// Measured max |param diff| 1.2e-7 (2 ranks) / 6e-8 (3, 4 ranks); 2e-6 is 0.02% of one step (lr 1e-2).
constexpr double kParamTol = 2e-6;
constexpr double kLossRelTol = 1e-6;

struct MeshSpec {
  int64_t rep, dp, tp;
};

std::vector<MeshSpec> meshes() {
  switch (world_size()) {
    case 1: return {{1, 1, 1}};
    case 2: return {{1, 2, 1}, {1, 1, 2}};
    case 3: return {{1, 3, 1}, {1, 1, 3}};
    case 4: return {{1, 2, 2}, {2, 1, 2}};
    default: return {};
  }
}

/// The mesh of `m` with dim names `names` ((replicate,) shard, tp); MeshContext's by default.
DeviceMesh make_mesh(const MeshSpec& m, const std::vector<std::string>& names = {"dp_replicate", "dp_shard", "tp"}) {
  if (m.rep > 1) return DeviceMesh({m.rep, m.dp, m.tp}, names);
  return DeviceMesh({m.dp, m.tp}, {names[1], names[2]});
}

/// The tiny net with TP on the mesh's last dim (whatever its name), then fully_shard per layer
/// and on the root over the whole mesh, or with `dp_mesh_only` over the dp dims alone
/// (PyTorch's call: the tp dim comes from the parameters' mesh).
std::shared_ptr<TinyNet> build(const DeviceMesh& mesh, const FSDPOptions& opt, bool dp_mesh_only = false) {
  auto net = make_net();
  const auto& names = mesh.dim_names();
  parallelize_module(*net, mesh[names.back()], tiny_tp_plan());
  const DeviceMesh fsdp = dp_mesh_only ? mesh[std::vector<std::string>(names.begin(), names.end() - 1)] : mesh;
  for (auto& l : net->layers->children()) fully_shard(*l, fsdp, opt);
  fully_shard(*net, fsdp, opt);
  return net;
}

/// This rank's data-parallel index and the dp size of a mesh ([replicate,] shard, tp).
std::pair<int64_t, int64_t> dp_of(const DeviceMesh& mesh, const MeshSpec& m) {
  const int64_t r = m.rep > 1 ? mesh.coordinate(0) : 0;
  return {r * m.dp + mesh.coordinate(m.rep > 1 ? 1 : 0), m.rep * m.dp};
}

/// Shape of parameter `fqn` on tp rank t under tiny_tp_plan (torch.chunk of the split dim).
Shape tp_local_shape(const std::string& fqn, Shape s, int64_t tp, int64_t t) {
  const bool row0 = fqn == "emb.weight" || fqn.find("fc1.") != std::string::npos || fqn.rfind("head.", 0) == 0;
  const bool col1 = fqn.find("fc2.weight") != std::string::npos;
  if (row0) s[0] = chunk_of(s[0], tp, t).size;
  if (col1) s[1] = chunk_of(s[1], tp, t).size;
  return s;
}

std::string unit_of(const std::string& fqn) {
  if (fqn.rfind("layers.", 0) == 0) return fqn.substr(0, fqn.find('.', 7));
  return "";
}

/// Trains the FSDP + TP net (build) on `mesh` (layout `ms`) for 5 AdamW steps and checks losses and
/// parameters against the single-process run `ref`.
void check_equals_single_process(const RunResult& ref, const DeviceMesh& mesh, const MeshSpec& ms, bool reshard,
                                 bool dp_mesh_only = false) {
  FSDPOptions opt;
  opt.reshard_after_forward = reshard;
  auto net = build(mesh, opt, dp_mesh_only);
  optim::AdamW adam(net->parameters(), optim::AdamWOptions{1e-2});
  TrainSpec s;
  std::tie(s.dp_rank, s.dp_size) = dp_of(mesh, ms);
  s.loss_pg = DeviceMesh::world("loss").group(0);  // tp ranks hold equal losses
  RunResult r;
  r.losses = train(*net, adam, s);
  r.params = full_params(*net);
  for (size_t i = 0; i < r.losses.size(); ++i) {
    INFO("step " << i << " single " << ref.losses[i] << " fsdp+tp " << r.losses[i]);
    CHECK(std::abs(r.losses[i] - ref.losses[i]) <= kLossRelTol * ref.losses[i]);
  }
  auto [d, where] = max_param_diff(ref.params, r.params);
  INFO("max |param diff| " << d << " at " << where);
  CHECK(d <= kParamTol);
}

}  // namespace

TEST_CASE("FSDP + TP: 5 AdamW steps equal the single-process run", "[fsdp][tp]") {
  const RunResult ref = reference_run(nullptr, /*sgd=*/false);
  for (const MeshSpec& ms : meshes())
    for (bool reshard : {true, false}) {
      INFO("mesh " << ms.rep << "x" << ms.dp << "x" << ms.tp << " reshard " << reshard);
      check_equals_single_process(ref, make_mesh(ms), ms, reshard);
    }
}

// FSDP + TP comes from the parameters' own meshes: the same run on meshes whose dims carry
// other names ("model" as the TP dim, torchtitan's "dp_shard_cp") is FSDP + TP too, whether
// fully_shard gets the whole mesh or (PyTorch's call) only its dp dims.
TEST_CASE("FSDP + TP: recognised from the parameters' meshes whatever the dim names", "[fsdp][tp]") {
  const RunResult ref = reference_run(nullptr, /*sgd=*/false);
  const std::vector<std::vector<std::string>> namings = {{"replica", "dp", "model"},
                                                        {"dp_replicate", "dp_shard_cp", "tp_inner"}};
  for (const MeshSpec& ms : meshes())
    for (const auto& names : namings) {
      INFO("mesh " << ms.rep << "x" << ms.dp << "x" << ms.tp << " names " << names[0] << "," << names[1] << ","
                   << names[2]);
      DeviceMesh mesh = make_mesh(ms, names);
      {  // Layout: a layer's colwise weight is (dp..., tp); the root, left with only the plain
         // norm once emb and head are units of their own, follows its TP units below.
        auto net = make_net();
        parallelize_module(*net, mesh[names[2]], tiny_tp_plan());
        for (auto& l : net->layers->children()) fully_shard(*l, mesh);
        fully_shard(*net->emb, mesh);
        fully_shard(*net->head, mesh);
        fully_shard(*net, mesh);
        Placements colwise{StridedShard(0, ms.tp), Shard(0)}, plain{Shard(0), Replicate()};
        if (ms.rep > 1) {
          colwise.insert(colwise.begin(), Replicate());
          plain.insert(plain.begin(), Replicate());
        }
        CHECK(fsdp_param_group(*net->layers->children()[0])->tp_layout());
        CHECK(placements(net->get_parameter("layers.0.fc1.weight")) == colwise);
        CHECK(fsdp_param_group(*net)->tp_layout());
        CHECK(placements(net->get_parameter("norm.weight")) == plain);
      }
      check_equals_single_process(ref, mesh, ms, /*reshard=*/true);
      // PyTorch's call: fully_shard(unit, mesh[dp dims]) over TP parameters on mesh[tp dim].
      check_equals_single_process(ref, mesh, ms, /*reshard=*/true, /*dp_mesh_only=*/true);
      auto net = build(mesh, FSDPOptions{}, /*dp_mesh_only=*/true);
      CHECK(fsdp_param_group(*net->layers->children()[0])->mesh() == mesh);
      CHECK(fsdp_param_group(*net)->tp_layout());
    }
}

TEST_CASE("FSDP + TP: colwise weights are strided shards; full_tensor gives the original rows", "[fsdp][tp]") {
  for (const MeshSpec& ms : meshes()) {
    if (ms.rep > 1) continue;
    INFO("mesh " << ms.dp << "x" << ms.tp);
    DeviceMesh mesh = make_mesh(ms);
    auto net = build(mesh, {});
    auto orig = make_net();
    const int64_t d = mesh.coordinate(0), t = mesh.coordinate(1);
    for (auto& [fqn, p] : net->named_parameters()) {
      INFO(fqn);
      REQUIRE(p.is_distributed());
      const Tensor o = orig->get_parameter(fqn);
      CHECK(max_abs_diff(full_tensor(p.detach()), o) == 0);
      const bool colwise = fqn.find("fc1.") != std::string::npos || fqn.rfind("head.", 0) == 0 || fqn == "emb.weight";
      const Placements& pl = placements(p);
      if (colwise) {
        CHECK(pl == Placements{StridedShard(0, ms.tp), Shard(0)});
        // (d, t) holds dp chunk d of TP block t: one contiguous range of global rows.
        const Chunk block = chunk_of(o.size(0), ms.tp, t);
        const Chunk piece = chunk_of(block.size, ms.dp, d);
        CHECK(local_tensor(p).size(0) == piece.size);
        if (piece.size > 0) {
          CHECK(dtensor_spec(p).local_offset()[0] == block.offset + piece.offset);
          CHECK(max_abs_diff(local_tensor(p), o.narrow(0, block.offset + piece.offset, piece.size)) == 0);
        }
      } else if (fqn.find("fc2.weight") != std::string::npos) {
        CHECK(pl == Placements{Shard(0), Shard(1)});
      } else {
        CHECK(pl == Placements{Shard(0), Replicate()});
      }
    }
  }
}

TEST_CASE("FSDP + TP: dp bytes per step equal the theoretical figure of the TP-local shards", "[fsdp][tp]") {
  for (const MeshSpec& ms : meshes()) {
    if (ms.rep > 1) continue;
    for (bool reshard : {true, false}) {
      INFO("mesh " << ms.dp << "x" << ms.tp << " reshard " << reshard);
      DeviceMesh mesh = make_mesh(ms);
      FSDPOptions opt;
      opt.reshard_after_forward = reshard;
      auto net = build(mesh, opt);
      optim::AdamW adam(net->parameters(), optim::AdamWOptions{1e-2});
      const int64_t n = ms.dp, t = mesh.coordinate(1);
      const auto [dp_rank, dp] = dp_of(mesh, ms);
      auto step = [&](int k) {
        const int64_t rows = kBatch / dp;
        auto [ids, tg] = batch_rows(k, dp_rank * rows, (dp_rank + 1) * rows);
        loss_of(*net, ids, tg).backward();
        adam.step();
        adam.zero_grad();
      };
      step(0);  // warm-up: records the forward order for prefetch
      CommCounters& cnt = mesh.group(0)->counters();
      cnt.reset();
      step(1);
      // Theory: per unit, the padded dp shards of the TP-local parameters (rows ceil(local / n)).
      std::map<std::string, int64_t> shard;
      auto orig = make_net();
      for (auto& [fqn, p] : orig->named_parameters()) {
        const Shape ls = tp_local_shape(fqn, p.sizes(), ms.tp, t);
        int64_t rest = 1;
        for (size_t k = 1; k < ls.size(); ++k) rest *= ls[k];
        shard[unit_of(fqn)] += (ls[0] + n - 1) / n * rest;
      }
      int64_t ag = 0, ag_calls = 0, rs = 0;
      for (auto& [unit, e] : shard) {
        const int64_t gathers = 1 + (reshard && !unit.empty() ? 1 : 0);
        ag += gathers * e;
        ag_calls += gathers;
        rs += n * e;
      }
      CHECK(cnt.count(CommKind::all_gather) == ag_calls);
      CHECK(cnt.nbytes(CommKind::all_gather) == ag * 4);
      CHECK(cnt.count(CommKind::reduce_scatter) == static_cast<int64_t>(shard.size()));
      CHECK(cnt.nbytes(CommKind::reduce_scatter) == rs * 4);
      CHECK(cnt.count(CommKind::all_reduce) == 0);
    }
  }
}

TEST_CASE("FSDP + TP: meshes that do not match are clear errors", "[fsdp][tp][errors]") {
  const int64_t w = world_size();
  // TP DTensors with a 1-d dp mesh (no tp dim).
  {
    DeviceMesh mesh({1, w}, {"dp_shard", "tp"});
    auto net = make_net();
    parallelize_module(*net, mesh["tp"], tiny_tp_plan());
    CHECK_THROWS_WITH(fully_shard(*net->layers->children()[0], DeviceMesh::world("dp")),
                      Catch::Contains("already a DTensor") && Catch::Contains("(dp_shard, tp) mesh"));
  }
  // tp not the last mesh dim.
  {
    DeviceMesh mesh({w, 1}, {"tp", "dp_shard"});
    auto net = make_net();
    parallelize_module(*net, mesh["tp"], tiny_tp_plan());
    CHECK_THROWS_WITH(fully_shard(*net->layers->children()[0], mesh), Catch::Contains("tp last"));
  }
  // The TP DTensors live on another tp mesh than the fully_shard mesh's tp dim.
  if (w > 1) {
    DeviceMesh tp_mesh_src({w, 1}, {"dp_shard", "tp"});  // tp size 1
    DeviceMesh fsdp_mesh({1, w}, {"dp_shard", "tp"});    // tp size w
    auto net = make_net();
    parallelize_module(*net, tp_mesh_src["tp"], tiny_tp_plan());
    CHECK_THROWS_WITH(fully_shard(*net->layers->children()[0], fsdp_mesh),
                      Catch::Contains("mesh dims do not match") && Catch::Contains("fc1.weight"));
  }
}
