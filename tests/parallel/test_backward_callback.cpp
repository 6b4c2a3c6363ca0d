// fully_shard's post-backward callback (queued on the autograd engine): the user calls nothing
// after backward(): units that got only part of their gradients are reduced, every unit is
// resharded and the gradients equal the single-process ones; a backward that throws leaves no
// stale callback behind.
#include "gradcheck.h"
#include "parallel_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
constexpr double kGradTol = 1e-6;

/// Fully-sharded TinyNet: its layers, then the root (emb, norm, head).
std::shared_ptr<TinyNet> sharded(const DeviceMesh& mesh, bool ac = false) {
  auto net = make_net();
  if (ac) apply_activation_checkpointing(*net, [](const std::string&, nn::Module& m) { return m.type_name() == "Block"; });
  for (auto& l : net->layers->children()) fully_shard(*l, mesh);
  fully_shard(*net, mesh);
  return net;
}

std::vector<nn::Module*> units(TinyNet& net) {
  std::vector<nn::Module*> u{&net};
  for (auto& l : net.layers->children()) u.push_back(l.get());
  return u;
}

/// Every parameter's gradient equals `ref`'s (full tensors); undefined in both or neither.
void check_grads(TinyNet& net, TinyNet& ref) {
  auto got = net.named_parameters(), want = ref.named_parameters();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].first);
    const Tensor g = got[i].second.grad(), w = want[i].second.grad();
    REQUIRE(g.defined() == w.defined());
    if (!g.defined()) continue;
    CHECK(max_abs_diff(full_tensor(g), w) <= kGradTol);
  }
}

/// The single-process model after one backward of the full batch 0.
std::shared_ptr<TinyNet> reference_grads() {
  auto ref = make_net();
  auto [ids, tg] = batch_rows(0, 0, kBatch);
  loss_of(*ref, ids, tg).backward();
  return ref;
}

/// Rows of this rank (equal shares of kBatch on 1-4 ranks).
std::pair<Tensor, Tensor> my_rows(int step = 0) {
  const int64_t n = kBatch / world_size();
  return batch_rows(step, rank() * n, (rank() + 1) * n);
}
}  // namespace

TEST_CASE("fully_shard: a unit with unused parameters is reduced at the end of backward, nothing called after it") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  auto net = sharded(mesh);
  // Only the root's embedding is used by the loss: the root unit gets 1 of its gradients, the
  // layers none. The callback reduces the root (zeros for norm / head) and reshards every unit.
  auto [ids, tg] = my_rows();
  net->call(ids);
  sum(net->emb->call(ids)).backward();
  for (nn::Module* u : units(*net)) CHECK_FALSE(fsdp_param_group(*u)->is_unsharded());
  CHECK(net->head->weight().grad().defined());
  // Single process: the mean over ranks of each rank's gradient; norm and head get zeros.
  auto ref = make_net();
  for (int r = 0; r < world_size(); ++r) {
    const int64_t n = kBatch / world_size();
    sum(ref->emb->call(batch_rows(0, r * n, (r + 1) * n).first)).backward();
  }
  NoGradGuard ng;
  for (auto& [n, p] : ref->named_parameters())
    if (p.grad().defined()) p.set_grad(div(p.grad(), static_cast<double>(world_size())));
  for (auto& [n, p] : ref->named_parameters())
    if (n.rfind("norm.", 0) == 0 || n.rfind("head.", 0) == 0) p.set_grad(zeros_like(p));
  check_grads(*net, *ref);
}

TEST_CASE("fully_shard: a full backward ends resharded with the single-process gradients (with AC)") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  for (bool ac : {false, true}) {
    INFO("ac " << ac);
    // The checkpointed blocks' recomputation runs a nested backward; the callback must wait for
    // the outer one (an early finish would reduce the root before its gradients are complete).
    auto net = sharded(mesh, ac);
    auto [ids, tg] = my_rows();
    loss_of(*net, ids, tg).backward();
    for (nn::Module* u : units(*net)) CHECK_FALSE(fsdp_param_group(*u)->is_unsharded());
    check_grads(*net, *reference_grads());
  }
}

TEST_CASE("fully_shard: a backward that throws leaves no stale post-backward callback") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  auto net = sharded(mesh);
  auto [ids, tg] = my_rows();
  Tensor logits = net->call(ids);
  // Runs after the root's own output hook (which queued the callback), before any reduction.
  logits.register_hook([](const Tensor&) -> Tensor { DTR_ERROR("injected failure in backward"); });
  CHECK_THROWS_WITH(cross_entropy(logits.reshape({-1, kVocab}), tg).backward(), Catch::Contains("injected failure"));
  CHECK(fsdp_param_group(*net)->is_unsharded());  // the callback did not run
  // An unrelated backward runs no leftover callback: the root stays gathered.
  Tensor a = from_vector<double>({1.0, 2.0}, {2}).set_requires_grad(true);
  sum(mul(a, 2.0)).backward();
  CHECK(fsdp_param_group(*net)->is_unsharded());
  // The next iteration queues its own callback: resharded, single-process gradients.
  for (auto& p : net->parameters()) p.set_grad(Tensor());
  loss_of(*net, ids, tg).backward();
  for (nn::Module* u : units(*net)) CHECK_FALSE(fsdp_param_group(*u)->is_unsharded());
  check_grads(*net, *reference_grads());
}
