// fully_shard: communication volume per step equals the theoretical FSDP figure (from the
// process-group byte counters), frozen parameters are never reduced (no reduce-scatter for a
// frozen-only unit), and sharded parameter + gradient + optimizer-state bytes per rank are
// 1/dp of the dp = 1 figure up to the padding of uneven shards; frozen parameters still gathered
// when a backward ends are not gathered again until their shard changes.
#include "parallel_test_util.h"
#include "tensor/autograd/grad_mode.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

/// Unit of a parameter FQN in the test model: "layers.0", "layers.1" or "" (root).
std::string unit_of(const std::string& fqn) {
  if (fqn.rfind("layers.", 0) == 0) return fqn.substr(0, fqn.find('.', 7));
  return "";
}

/// Theoretical per-rank figures of one unit: padded shard elements (all / trainable).
struct UnitFigures {
  int64_t shard = 0, grad_shard = 0;
};

std::map<std::string, UnitFigures> theory(TinyNet& net, int64_t n) {
  std::map<std::string, UnitFigures> out;
  for (auto& [fqn, p] : net.named_parameters()) {
    const int64_t rest = p.numel() / p.size(0);
    const int64_t padded = (p.size(0) + n - 1) / n * rest;
    auto& u = out[unit_of(fqn)];
    u.shard += padded;
    if (p.requires_grad()) u.grad_shard += padded;
  }
  return out;
}

std::shared_ptr<TinyNet> build(const DeviceMesh& mesh, const FSDPOptions& opt, const std::function<void(TinyNet&)>& prep) {
  auto net = make_net();
  if (prep) prep(*net);
  for (auto& l : net->layers->children()) fully_shard(*l, mesh, opt);
  fully_shard(*net, mesh, opt);
  return net;
}

void one_step(TinyNet& net, optim::Optimizer& opt, int step, int micro) {
  const int64_t n = world_size(), rows = kBatch / n, mrows = rows / micro;
  for (int k = 0; k < micro; ++k) {
    if (micro > 1) set_requires_gradient_sync(net, k == micro - 1);
    auto [ids, tg] = batch_rows(step, rank() * rows + k * mrows, rank() * rows + (k + 1) * mrows);
    div(loss_of(net, ids, tg), static_cast<double>(micro)).backward();
  }
  opt.step();
}

const std::function<void(TinyNet&)> kNoFreeze;
void freeze_layer0(TinyNet& net) {
  for (auto& p : net.layers->children()[0]->parameters()) p.set_requires_grad(false);
}
void freeze_all_but_layer1(TinyNet& net) {
  for (auto& [fqn, p] : net.named_parameters())
    if (unit_of(fqn) != "layers.1") p.set_requires_grad(false);
}

}  // namespace

TEST_CASE("fully_shard: bytes per step equal the theoretical all-gather + reduce-scatter volume") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  const int64_t n = world_size();
  struct Case {
    const char* name;
    std::function<void(TinyNet&)> prep;
    bool reshard;
    int micro;
  };
  const std::vector<Case> cases = {{"all trainable", kNoFreeze, true, 1},
                                   {"no reshard", kNoFreeze, false, 1},
                                   {"grad accumulation 4", kNoFreeze, true, 4},
                                   {"layer 0 frozen", freeze_layer0, true, 1},
                                   {"only layer 1 trainable", freeze_all_but_layer1, true, 1}};
  for (const Case& c : cases) {
    INFO(c.name);
    FSDPOptions opt;
    opt.reshard_after_forward = c.reshard;
    auto net = build(mesh, opt, c.prep);
    auto ref = make_net();
    if (c.prep) c.prep(*ref);
    auto th = theory(*ref, n);
    std::vector<Tensor> ps;
    for (auto& p : net->parameters())
      if (p.requires_grad()) ps.push_back(p);
    optim::AdamW adam(ps, optim::AdamWOptions{1e-2});
    one_step(*net, adam, 0, c.micro);  // warm-up (records the forward order for prefetch)
    adam.zero_grad();
    CommCounters& cnt = mesh.group(0)->counters();
    cnt.reset();
    one_step(*net, adam, 1, c.micro);
    // Forward gathers every unit; backward again the non-root units when resharded. A frozen
    // root stays gathered from the warm-up step's end (FSDPParamGroup::reshard(keep_frozen)).
    int64_t ag_elems = 0, ag_calls = 0, rs_elems = 0, rs_calls = 0;
    for (auto& [unit, f] : th) {
      const int64_t gathers = unit.empty() && f.grad_shard == 0 ? 0 : 1 + (c.reshard && !unit.empty() ? 1 : 0);
      ag_elems += c.micro * gathers * f.shard;
      ag_calls += c.micro * gathers;
      if (f.grad_shard > 0) {
        rs_elems += n * f.grad_shard;  // input of the reduce-scatter: n padded segments
        ++rs_calls;
      }
    }
    CHECK(cnt.count(CommKind::all_gather) == ag_calls);
    CHECK(cnt.nbytes(CommKind::all_gather) == ag_elems * 4);
    CHECK(cnt.count(CommKind::reduce_scatter) == rs_calls);
    CHECK(cnt.nbytes(CommKind::reduce_scatter) == rs_elems * 4);
    CHECK(cnt.count(CommKind::all_reduce) == 0);
  }
}

TEST_CASE("fully_shard: frozen-only units issue no reduce-scatter; training still equals single process") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  for (auto prep : {freeze_layer0, freeze_all_but_layer1}) {
    const RunResult ref = reference_run(prep, /*sgd=*/true);
    auto net = build(mesh, {}, prep);
    // Frozen parameters stay frozen after sharding.
    auto plain = make_net();
    prep(*plain);
    for (auto& [fqn, p] : net->named_parameters()) CHECK(p.requires_grad() == plain->get_parameter(fqn).requires_grad());
    std::vector<Tensor> ps;
    for (auto& p : net->parameters())
      if (p.requires_grad()) ps.push_back(p);
    optim::SGD sgd(ps, optim::SGDOptions{0.1});
    TrainSpec s;
    s.dp_rank = rank();
    s.dp_size = world_size();
    s.loss_pg = DeviceMesh::world("loss").group(0);
    CommCounters& cnt = mesh.group(0)->counters();
    cnt.reset();
    RunResult r;
    r.losses = train(*net, sgd, s);
    const int trainable_units = prep == freeze_layer0 ? 2 : 1;
    CHECK(cnt.count(CommKind::reduce_scatter) == 5 * trainable_units);
    r.params = full_params(*net);
    for (size_t i = 0; i < r.losses.size(); ++i) CHECK(std::abs(r.losses[i] - ref.losses[i]) <= 2e-6 * ref.losses[i]);
    auto [d, where] = max_param_diff(ref.params, r.params);
    INFO("max diff " << d << " at " << where);
    CHECK(d <= 1e-6);
    // Frozen parameters did not move and have no gradient.
    for (auto& [fqn, p] : net->named_parameters())
      if (!p.requires_grad()) {
        CHECK(!p.grad().defined());
        CHECK(amax(abs(sub(r.params.at(fqn), plain->get_parameter(fqn)))).item<double>() == 0.0);
      }
  }
}

TEST_CASE("fully_shard: parameter + gradient + optimizer state bytes per rank are 1/dp") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  const int64_t n = world_size();
  auto net = build(mesh, {}, kNoFreeze);
  optim::AdamW adam(net->parameters(), optim::AdamWOptions{1e-2});
  one_step(*net, adam, 0, 1);
  int64_t mine = 0, bound = 0, total = 0;
  for (auto& p : net->parameters()) {
    mine += static_cast<int64_t>(local_tensor(p).nbytes());
    REQUIRE(p.grad().defined());
    mine += static_cast<int64_t>(local_tensor(p.grad()).nbytes());
    for (auto& [k, t] : adam.state(p).tensors) mine += static_cast<int64_t>(t.nbytes());
    const int64_t rest = p.numel() / p.size(0);
    bound += (p.size(0) + n - 1) / n * rest * 4 * 4;  // param, grad, exp_avg, exp_avg_sq (f32)
    total += p.numel() * 4 * 4;
  }
  CHECK(mine <= bound);
  // No byte is held twice: the ranks' bytes add up to the dp = 1 figure.
  Tensor sum_t = from_vector<int64_t>({mine}, {1});
  mesh.group(0)->all_reduce(sum_t, ReduceOp::SUM)->wait();
  CHECK(sum_t.item<int64_t>() == total);
  INFO("per rank " << mine << " bytes, dp=1 " << total << " bytes, bound " << bound);
  CHECK(static_cast<double>(mine) <= static_cast<double>(total) / static_cast<double>(n) + (bound - total / n));
}

TEST_CASE("fully_shard: frozen parameters kept gathered after backward are gathered again only when their shard changes") {
  // Only layer 1 trainable: the root (emb, norm, head) is frozen and still unsharded when the
  // backward ends, so it stays gathered and the next forward issues no all-gather for it
  // (FSDPParamGroup::reshard(keep_frozen)). A frozen shard written between steps (copy_, as a
  // checkpoint load does) must be gathered again: the losses and parameters equal a
  // single-process run with the same write.
  DeviceMesh mesh = DeviceMesh::world("dp");
  auto scale_head = [](nn::Module& m) {
    NoGradGuard ng;
    Tensor p = m.get_parameter("head.weight");
    Tensor& t = p.is_distributed() ? const_cast<Tensor&>(local_tensor(p)) : p;
    t.copy_(mul(t, 0.5));
  };
  auto run = [&](nn::Module& net, bool dist, std::vector<int64_t>* root_gathers) {
    std::vector<Tensor> ps;
    for (auto& p : net.parameters())
      if (p.requires_grad()) ps.push_back(p);
    optim::SGD sgd(ps, optim::SGDOptions{0.1});
    TrainSpec s;
    s.steps = 1;
    if (dist) {
      s.dp_rank = rank();
      s.dp_size = world_size();
      s.loss_pg = DeviceMesh::world("loss").group(0);
    }
    std::vector<double> losses;
    CommCounters& cnt = mesh.group(0)->counters();
    for (int step = 0; step < 4; ++step) {
      if (step == 2) scale_head(net);
      cnt.reset();
      for (double l : train(net, sgd, s)) losses.push_back(l);
      if (root_gathers) root_gathers->push_back(cnt.count(CommKind::all_gather));
    }
    return losses;
  };
  auto ref = make_net();
  freeze_all_but_layer1(*ref);
  const std::vector<double> ref_losses = run(*ref, false, nullptr);
  auto net = build(mesh, {}, freeze_all_but_layer1);
  std::vector<int64_t> gathers;
  const std::vector<double> losses = run(*net, true, &gathers);
  for (size_t i = 0; i < losses.size(); ++i) CHECK(std::abs(losses[i] - ref_losses[i]) <= 2e-6 * ref_losses[i]);
  auto [d, where] = max_param_diff(full_params(*ref), full_params(*net));
  INFO("max diff " << d << " at " << where);
  CHECK(d <= 1e-6);
  if (world_size() == 1) return;
  // Per step: layer 0 twice (forward, and layer 1's backward prefetch), layer 1 twice, the root
  // only in the first step and in the step after its shard was written.
  CHECK(gathers == std::vector<int64_t>{5, 4, 5, 4});
}
