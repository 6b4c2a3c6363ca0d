// Activation checkpointing of the debug Llama's decoder layers, full and selective (recompute
// cheap ops, keep matmul / attention outputs): loss and every gradient equal the run without
// checkpointing (f64 and f32), and the bytes held between forward and backward (allocator
// counters: saved activations + logits) order full < selective < none.
#include <catch2/catch.hpp>

#include "models/transformer/causal_lm.h"
#include "parallel/activation_checkpoint.h"
#include "tensor/allocator.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

enum class AC { none, full, selective };

struct Result {
  double loss = 0;
  std::map<std::string, Tensor> grads;
  int64_t held_bytes = 0;  // allocator bytes alive after forward, before backward
};

Result run(AC ac, DType dt) {
  manual_seed(5);
  auto m = std::make_shared<LlamaForCausalLM>(llama_debug_config(), dt);
  if (ac != AC::none)
    for (auto& l : m->model()->layers()->children())
      checkpoint_module(*l, ac == AC::full ? CheckpointPolicy::full : CheckpointPolicy::selective);
  std::vector<int64_t> v;
  for (int64_t i = 0; i < 4 * 32; ++i) v.push_back((i * 37 + 11) % 128);
  Tensor ids = from_vector<int64_t>(v, {4, 32});
  Result r;
  const int64_t before = memory_stats().current;
  Tensor loss = causal_lm_loss(m->call(ids), ids);
  r.held_bytes = memory_stats().current - before;
  loss.backward();
  r.loss = loss.item<double>();
  for (auto& [n, p] : m->named_parameters()) {
    REQUIRE(p.grad().defined());
    r.grads[n] = p.grad().clone();
  }
  return r;
}

}  // namespace

TEST_CASE("activation checkpointing: full and selective equal no checkpointing; memory full < selective < none",
          "[ac]") {
  for (DType dt : {DType::f64, DType::f32}) {
    // The recomputation runs the same kernels on the same inputs, and selective returns the
    // saved outputs of the very ops it skips: results are identical; the tolerance only allows
    // for a kernel whose threads could sum in another order (none measured).
    const double tol = dt == DType::f64 ? 1e-12 : 1e-6;
    INFO("dtype " << dt);
    const Result none = run(AC::none, dt), full = run(AC::full, dt), sel = run(AC::selective, dt);
    for (const Result* r : {&full, &sel}) {
      CHECK(std::abs(r->loss - none.loss) <= tol * std::abs(none.loss));
      for (auto& [n, g] : none.grads) {
        INFO(n);
        CHECK(amax(abs(sub(r->grads.at(n), g))).item<double>() <= tol * (1 + amax(abs(g)).item<double>()));
      }
    }
    INFO("held bytes: none " << none.held_bytes << " selective " << sel.held_bytes << " full " << full.held_bytes);
    CHECK(full.held_bytes < sel.held_bytes);
    CHECK(sel.held_bytes < none.held_bytes);
  }
}

TEST_CASE("activation checkpointing: policy names", "[ac]") {
  CHECK(checkpoint_policy_from_name("full") == CheckpointPolicy::full);
  CHECK(checkpoint_policy_from_name("selective") == CheckpointPolicy::selective);
  CHECK_THROWS_WITH(checkpoint_policy_from_name("some"), Catch::Contains("'some'") && Catch::Contains("selective"));
  CHECK(selective_ac_save_list() == std::vector<std::string>{"mm", "bmm", "sdpa"});
}
