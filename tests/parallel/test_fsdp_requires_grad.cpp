// requires_grad changed after fully_shard (FSDP2 behaviour): a parameter frozen after sharding
// is no longer reduced and never moves again; one unfrozen after sharding is reduced and trained
// from its unit's next forward. Training with such a change at step 2 equals the single-process
// run with the same change (losses, full parameters), on the 1-d dp mesh and on FSDP + TP meshes,
// with and without gradient accumulation. Freezing a parameter that holds unsynced gradients is a
// clear error.
#include "gradcheck.h"
#include "parallel_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

/// f32 AdamW over 5 steps: dp / tp only change summation orders (see test_fsdp.cpp and
/// test_fsdp_tp.cpp: measured <= 1.2e-7); 2e-6 is 0.02% of one step at lr 1e-2.
constexpr double kParamTol = 2e-6;
constexpr double kLossTol = 2e-6;

/// Every parameter of layers.1 (a whole unit) and two of other units (a block, the root).
const std::vector<std::string> kChanged = {"layers.0.fc1.weight", "head.weight",      "layers.1.norm.weight",
                                           "layers.1.fc1.weight", "layers.1.fc1.bias", "layers.1.fc2.weight",
                                           "layers.1.fc2.bias"};

void set_rg(nn::Module& m, bool rg) {
  for (auto& [n, p] : m.named_parameters())
    if (std::find(kChanged.begin(), kChanged.end(), n) != kChanged.end()) p.set_requires_grad(rg);
}

/// How the model is distributed: none (single process), 1-d FSDP, or FSDP + TP on (dp, tp).
struct Layout {
  int64_t dp = 1, tp = 1;
  bool sharded = false;
};

/// Freeze (`unfreeze` false) or unfreeze kChanged after 2 of 5 steps, `micro` micro-steps each.
/// With `unfreeze` they start frozen (set before sharding). The optimizer holds every parameter.
/// Returns the run and the full values of kChanged right after the change.
std::pair<RunResult, std::map<std::string, Tensor>> run(const Layout& l, bool unfreeze, int micro) {
  auto net = make_net();
  if (unfreeze) set_rg(*net, false);
  std::unique_ptr<DeviceMesh> mesh;
  if (l.sharded) {
    if (l.tp > 1) {
      mesh = std::make_unique<DeviceMesh>(Shape{l.dp, l.tp}, std::vector<std::string>{"dp_shard", "tp"});
      parallelize_module(*net, (*mesh)["tp"], tiny_tp_plan());
    } else {
      mesh = std::make_unique<DeviceMesh>(DeviceMesh::world("dp"));
    }
    for (auto& b : net->layers->children()) fully_shard(*b, *mesh);
    fully_shard(*net, *mesh);
  }
  optim::AdamW adam(net->parameters(), optim::AdamWOptions{1e-2});
  TrainSpec s;
  s.steps = 2;
  s.micro = micro;
  s.dp_size = l.dp;
  s.dp_rank = l.sharded ? mesh->coordinate(0) : 0;
  if (l.sharded) {
    s.loss_pg = DeviceMesh::world("loss").group(0);  // tp ranks hold equal losses
    if (micro > 1) s.set_sync = [](nn::Module& m, bool sync) { set_requires_gradient_sync(m, sync); };
  }
  RunResult r;
  r.losses = train(*net, adam, s);
  set_rg(*net, unfreeze);
  std::map<std::string, Tensor> at_change;
  for (auto& [n, t] : full_params(*net))
    if (std::find(kChanged.begin(), kChanged.end(), n) != kChanged.end()) at_change[n] = t.clone();  // 1 rank: an alias
  s.steps = 3;
  for (double x : train(*net, adam, s)) r.losses.push_back(x);
  r.params = full_params(*net);
  for (auto& [n, p] : net->named_parameters()) {
    INFO(n);
    const bool changed = std::find(kChanged.begin(), kChanged.end(), n) != kChanged.end();
    CHECK(p.requires_grad() == (changed ? unfreeze : true));
  }
  return {r, at_change};
}

std::vector<Layout> layouts() {
  const int64_t w = world_size();
  std::vector<Layout> out{{w, 1, true}};
  if (w == 2) out.push_back({1, 2, true});
  if (w == 3) out.push_back({1, 3, true});
  if (w == 4) out.push_back({2, 2, true});
  return out;
}

}  // namespace

TEST_CASE("fully_shard: requires_grad changed after sharding is honoured from the next forward",
          "[fsdp][requires_grad]") {
  for (bool unfreeze : {false, true})
    for (int micro : {1, 2}) {
      const auto [ref, ref_at] = run(Layout{}, unfreeze, micro);
      for (const Layout& l : layouts()) {
        INFO((unfreeze ? "unfreeze" : "freeze") << " micro " << micro << " mesh " << l.dp << "x" << l.tp);
        const auto [got, at] = run(l, unfreeze, micro);
        for (size_t i = 0; i < ref.losses.size(); ++i) {
          INFO("step " << i << ": single " << ref.losses[i] << " fsdp " << got.losses[i]);
          CHECK(std::abs(ref.losses[i] - got.losses[i]) <= kLossTol * ref.losses[i]);
        }
        auto [d, where] = max_param_diff(ref.params, got.params);
        INFO("max |param diff| " << d << " at " << where);
        CHECK(d <= kParamTol);
        for (const std::string& n : kChanged) {
          INFO(n);
          const double moved = max_abs_diff(got.params.at(n), at.at(n));
          if (unfreeze) CHECK(moved > 1e-3);  // trained after the change
          else CHECK(moved == 0.0);           // frozen: never updated again
        }
      }
    }
}

TEST_CASE("fully_shard: freezing a parameter that holds unsynced gradients is a clear error",
          "[fsdp][requires_grad][errors]") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  auto net = make_net();
  for (auto& b : net->layers->children()) fully_shard(*b, mesh);
  fully_shard(*net, mesh);
  set_requires_gradient_sync(*net, false);
  auto [ids, tg] = batch_rows(0, 0, 4);
  loss_of(*net, ids, tg).backward();
  net->layers->children()[0]->get_parameter("fc1.weight").set_requires_grad(false);
  CHECK_THROWS_WITH(loss_of(*net, ids, tg),
                    Catch::Contains("fc1.weight") && Catch::Contains("unsynced") && Catch::Contains("requires_grad"));
}
