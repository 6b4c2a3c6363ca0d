// replicate (DDP): training equals the single-process run; bucketed all-reduce volume.
#include "parallel/ddp.h"
#include "parallel_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
/// f32: only the summation order of the gradient average differs (see test_fsdp.cpp).
constexpr double kParamTol = 1e-6;
}  // namespace

TEST_CASE("replicate: SGD and AdamW training equal the single-process run") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  for (bool sgd : {true, false})
    for (int micro : {1, 4})
      for (int64_t cap : {int64_t{64}, int64_t{25} << 20}) {
        INFO("sgd " << sgd << " micro " << micro << " bucket cap " << cap);
        const RunResult ref = reference_run({}, sgd);
        auto net = make_net();
        DDPOptions o;
        o.bucket_cap_bytes = cap;
        replicate(*net, mesh, o);
        if (cap == 64) CHECK(replicate_num_buckets(*net) > 3);
        else CHECK(replicate_num_buckets(*net) == 1);
        std::unique_ptr<optim::Optimizer> opt;
        if (sgd) opt = std::make_unique<optim::SGD>(net->parameters(), optim::SGDOptions{0.1});
        else opt = std::make_unique<optim::AdamW>(net->parameters(), optim::AdamWOptions{1e-2});
        CommCounters& cnt = mesh.group(0)->counters();
        cnt.reset();
        TrainSpec s;
        s.micro = micro;
        s.dp_rank = rank();
        s.dp_size = world_size();
        s.loss_pg = DeviceMesh::world("loss").group(0);
        if (micro > 1) s.set_sync = [](nn::Module& m, bool sync) { replicate_set_requires_gradient_sync(m, sync); };
        RunResult r;
        r.losses = train(*net, *opt, s);
        // One all-reduce per bucket per step, carrying every gradient once.
        int64_t bytes = 0;
        for (auto& p : net->parameters()) bytes += static_cast<int64_t>(p.nbytes());
        CHECK(cnt.count(CommKind::all_reduce) == 5 * replicate_num_buckets(*net));
        CHECK(cnt.nbytes(CommKind::all_reduce) == 5 * bytes);
        r.params = full_params(*net);
        for (size_t i = 0; i < r.losses.size(); ++i) CHECK(std::abs(r.losses[i] - ref.losses[i]) <= 2e-6 * ref.losses[i]);
        auto [d, where] = max_param_diff(ref.params, r.params);
        INFO("max diff " << d << " at " << where);
        CHECK(d <= kParamTol);
      }
}

TEST_CASE("replicate: unused parameters get zeros at the end of backward, nothing called after it") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  auto net = make_net();
  replicate(*net, mesh);
  // Only the embedding is used: head/norm/layers get no gradient; the end-of-backward callback
  // launches their buckets with zeros, so emb.weight's is the average over the ranks.
  auto [ids, tg] = batch_rows(0, rank(), rank() + 1);
  net->call(ids);  // starts the iteration (forward pre-hook)
  sum(net->emb->call(ids)).backward();
  REQUIRE(net->head->weight().grad().defined());
  CHECK(amax(abs(net->head->weight().grad())).item<double>() == 0.0);
  // Single process: the mean over ranks r of d sum(emb(ids_r)) / d emb.weight.
  auto ref = make_net();
  for (int r = 0; r < world_size(); ++r) sum(ref->emb->call(batch_rows(0, r, r + 1).first)).backward();
  Tensor want = div(ref->emb->weight().grad(), static_cast<double>(world_size()));
  CHECK(amax(abs(sub(net->emb->weight().grad(), want))).item<double>() <= 1e-6);
}

TEST_CASE("replicate: requires_grad changed after replicate is a clear error, not a silent update") {
  // Frozen later, a parameter would get an all-reduced zero gradient (AdamW moves it); unfrozen
  // later, it would be stepped with each rank's own gradient (ranks drift apart).
  DeviceMesh mesh = DeviceMesh::world("dp");
  auto [ids, tg] = batch_rows(0, rank(), rank() + 1);
  for (bool freeze : {true, false}) {
    INFO("freeze " << freeze);
    auto net = make_net();
    if (!freeze) net->head->weight().set_requires_grad(false);
    replicate(*net, mesh);
    loss_of(*net, ids, tg).backward();
    net->head->weight().set_requires_grad(freeze ? false : true);
    CHECK_THROWS_WITH(loss_of(*net, ids, tg),
                      Catch::Contains("head.weight") && Catch::Contains("requires_grad") && Catch::Contains("replicate"));
  }
}
