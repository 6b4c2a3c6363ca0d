// The tiny Qwen3-MoE (tests/golden/qwen3_moe_debug: 4 experts, one dense layer) through
// parallelize_model with expert parallelism, alone and with attention TP (the family's sidecar):
// 3 AdamW steps of the causal-LM loss + router_aux_loss_coef x load-balancing loss equal the
// single process (losses and every parameter), on 2 ranks (ep 2; tp 2) and 4 (ep 2 x ep_shard 2;
// ep 2 x tp 2; ep 4). The aux loss is per dp rank (its micro-batch), so the single process runs
// each rank's rows as one micro-batch of gradient accumulation.
#include <catch2/catch.hpp>

#include "dtensor/api.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/load.h"
#include "parallel/model_parallelizer.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"

using namespace dtr;

namespace {
/// f32: sums in other orders; AdamW (lr 1e-3) amplifies tiny differences of near-zero gradients,
/// up to a few 1e-6 after 3 steps; a wrong gradient moves parameters by whole steps (1e-3).
constexpr double kParamTol = 5e-5;
constexpr double kLossRelTol = 1e-5;
constexpr int64_t kBatch = 8, kSeq = 10;

Tensor rows(int step, int64_t b0, int64_t b1) {
  std::vector<int64_t> v;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t t = 0; t < kSeq; ++t) v.push_back((b * 13 + t * 7 + step * 5 + (b * t) % 3) % 128);
  return from_vector<int64_t>(v, {b1 - b0, kSeq});
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
};

/// 3 steps; `dp` micro-batches of kBatch / dp rows each (on one rank, or one per dp rank).
Run train(CausalLM& m, const MeshContext* ctx, int64_t dp) {
  std::vector<Tensor> ps;
  for (auto& p : m.parameters()) ps.push_back(p);
  optim::AdamW adam(ps, optim::AdamWOptions{1e-3});
  auto world = DeviceMesh::world("loss").group(0);
  Run r;
  const int64_t n = kBatch / dp;
  for (int step = 0; step < 3; ++step) {
    double loss_sum = 0;
    for (int64_t d = 0; d < dp; ++d) {
      if (ctx && d != ctx->dp_rank()) continue;
      Tensor ids = rows(step, d * n, (d + 1) * n);
      Tensor loss = m.forward_loss(ids, ids);  // includes 0.01 x the aux loss
      // The dp mean of the gradients is the mean over micro-batches: one rank's share is 1/dp
      // (FSDP divides by dp), the single process divides each micro-batch by dp itself.
      (ctx ? loss : mul(loss, 1.0 / dp)).backward();
      loss_sum += (loss.is_distributed() ? full_tensor(loss.detach()) : loss).item<double>();
    }
    adam.step();
    adam.zero_grad();
    Tensor l = from_vector<double>({loss_sum / dp / (ctx ? ctx->tp_size : 1)}, {1});
    if (ctx) world->all_reduce(l, ReduceOp::SUM)->wait();
    r.losses.push_back(l.item<double>());
  }
  for (auto& [k, p] : m.named_parameters()) r.params[k] = p.is_distributed() ? full_tensor(p.detach()) : p.detach().clone();
  return r;
}
}  // namespace

TEST_CASE("Qwen3-MoE with expert parallelism (and attention TP) equals the single process", "[moe][ep]") {
  const int64_t w = world_size();
  struct Cfg {
    int64_t tp, ep;
  };
  std::vector<Cfg> cfgs;
  if (w == 2) cfgs = {{1, 2}, {2, 1}};
  if (w == 4) cfgs = {{1, 2}, {2, 2}, {1, 4}};
  for (const Cfg& c : cfgs) {
    INFO("tp " << c.tp << " ep " << c.ep);
    MeshContext ctx;
    ctx.world_size = w;
    ctx.tp_size = c.tp;
    ctx.dp_size = w / c.tp;
    ctx.ep_size = c.ep;
    ctx.validate("test");
    ctx.build_mesh();
    auto ref_model = load_model_hf("tests/golden/qwen3_moe_debug");
    const Run ref = train(*ref_model, nullptr, ctx.dp_size);
    auto m = load_model_hf("tests/golden/qwen3_moe_debug");
    parallelize_model(*m, ctx);
    const Run got = train(*m, &ctx, ctx.dp_size);
    for (size_t i = 0; i < ref.losses.size(); ++i) {
      INFO("step " << i << " single " << ref.losses[i] << " distributed " << got.losses[i]);
      CHECK(std::abs(ref.losses[i] - got.losses[i]) <= kLossRelTol * ref.losses[i]);
    }
    double worst = 0;
    std::string where;
    for (auto& [k, t] : ref.params) {
      REQUIRE(got.params.count(k));
      const double d = amax(abs(sub(t, got.params.at(k)))).item<double>();
      if (d > worst) worst = d, where = k;
    }
    INFO("max |param diff| " << worst << " at " << where);
    CHECK(worst <= kParamTol);
  }
}
