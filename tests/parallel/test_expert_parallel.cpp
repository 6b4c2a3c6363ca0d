// Expert parallelism through parallelize_model: a two-layer f64 net of nn::MoE blocks (12
// experts, top-2) plus a dense projection, experts sharded over ep and FSDP over the rest, the
// dense parameters FSDP over the whole dp mesh. Forward loss, first-step gradients (full_tensor)
// and 5 AdamW steps equal the single-process run, on 2 ranks (ep 2), 3 (ep 3), 4 (ep 4; ep 2 x
// ep_shard 2; ep 2 with tp 2; ep 2 with HSDP; ep 2 with full activation checkpointing; LoRA on the
// experts with frozen base experts on 2, 3 and 4 ranks), with
// random and with skewed routing (expert 0 takes every token, expert 11 none). The bytes the ep
// all-to-alls send equal what the single-process routing of each rank's rows implies, and
// clip_grad_norm's total norm the single-process one. MeshContext
// errors for ep.
#include <catch2/catch.hpp>

#include <cmath>

#include "dtensor/api.h"
#include "parallel/clip_grad.h"
#include "parallel/expert_parallel.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/mesh_context.h"
#include "parallel/model_parallelizer.h"
#include "parallel/tensor_parallel/style.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/nn/module_list.h"
#include "tensor/nn/moe.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

constexpr int64_t kE = 12, kK = 2, kH = 6, kI = 5, kBatch = 12, kSeq = 3;
/// f64: sums in other orders (~1e-16 relative); AdamW divides by sqrt(v) + 1e-8, which can blow
/// a 1e-16 gradient difference up by 1e8 for near-zero gradients: 1e-8 is still far below one
/// step (lr 1e-2), which a wrong gradient would move a parameter by.
constexpr double kParamTol = 1e-8;
constexpr double kGradTol = 1e-12;
constexpr double kLossRelTol = 1e-12;

struct MoEBlock : nn::Module {
  explicit MoEBlock(const nn::MoEConfig& c) {
    register_module("mlp", std::make_shared<nn::MoE>(c, DType::f64));
    register_module("proj", std::make_shared<nn::Linear>(kH, kH, false, DType::f64));
  }
  std::string type_name() const override { return "MoEBlock"; }
  Tensor forward(const Tensor& x) override {
    Tensor h = add(x, get_submodule("mlp")->call(x));
    return add(h, get_submodule("proj")->call(h));
  }
};

struct MoENet : nn::Module {
  MoENet() {
    nn::MoEConfig c;
    c.hidden_size = kH;
    c.moe_intermediate_size = kI;
    c.num_experts = kE;
    c.num_experts_per_tok = kK;
    auto layers = register_module("layers", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) layers->push_back(std::make_shared<MoEBlock>(c));
  }
  std::string type_name() const override { return "MoENet"; }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (auto& l : get_submodule("layers")->children()) h = l->call(h);
    return h;
  }
};

/// TP plan of the test net: the dense projection colwise with a replicated (plain) output; the
/// MoE blocks run on plain replicated tokens.
struct MoENetParallelizer : ModelParallelizer {
  ParallelizePlan tp_plan(nn::Module&, const MeshContext&) override {
    return {{"layers.*.proj", std::make_shared<ColwiseParallel>(Replicate(), Replicate(), true)}};
  }
};
DTR_REGISTER_MODEL_PARALLELIZER("MoENet", MoENetParallelizer);

/// The same net on every rank; `skewed`: layer 0's router sends every token to expert 0 first
/// and never to expert 11 (inputs are positive, row 0 large positive, row 11 large negative).
std::shared_ptr<MoENet> make_net(bool skewed, bool lora = false) {
  manual_seed(77);
  auto m = std::make_shared<MoENet>();
  if (lora)  // grouped expert adapters (base experts frozen), B random so A trains from step 0
    for (auto& moe : nn::moe_modules(*m)) {
      nn::LoraOptions o;
      o.r = 2;
      o.alpha = 4;
      auto ex = moe->experts();
      ex->enable_lora(o);
      for (const char* n : {"gate_up_proj_lora_B", "down_proj_lora_B"})
        ex->set_parameter(n, uniform(ex->parameter(n).sizes(), -0.5, 0.5, TensorOptions(DType::f64)).set_requires_grad(true));
    }
  for (auto& [n, p] : m->named_parameters())
    if (n.find("gate.weight") != std::string::npos) {
      Tensor w = uniform(p.sizes(), -1, 1, TensorOptions(DType::f64));
      if (skewed && n.rfind("layers.0.", 0) == 0) {
        w.narrow(0, 0, 1).fill_(3.0);
        w.narrow(0, kE - 1, 1).fill_(-3.0);
      }
      m->set_parameter(n, w.set_requires_grad(true));
    }
  return m;
}

/// Global batch of a step: x [kBatch, kSeq, kH] in (0, 1) and the target the loss is dotted with.
std::pair<Tensor, Tensor> global_batch(int step) {
  manual_seed(1000 + step);
  Tensor x = uniform({kBatch, kSeq, kH}, 0.05, 1, TensorOptions(DType::f64));
  Tensor t = uniform({kBatch, kSeq, kH}, -1, 1, TensorOptions(DType::f64));
  return {x, t};
}

/// Rows of dp rank r of dp (torch.chunk: uneven allowed).
std::pair<int64_t, int64_t> rows_of(int64_t r, int64_t dp) {
  const int64_t c = (kBatch + dp - 1) / dp;
  const int64_t b = std::min(kBatch, r * c);
  return {b, std::min(kBatch, b + c)};
}

/// Loss of rank r: dp * sum(out * target) / global tokens, so the dp-mean of gradients is the
/// gradient of the global token mean (the trainer's weighting).
Tensor loss_on(nn::Module& m, int step, int64_t r, int64_t dp) {
  auto [x, t] = global_batch(step);
  auto [b0, b1] = rows_of(r, dp);
  Tensor out = m.call(x.narrow(0, b0, b1 - b0));
  return mul(sum(mul(out, t.narrow(0, b0, b1 - b0))), static_cast<double>(dp) / (kBatch * kSeq));
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, Tensor> grads0, params;
  double norm0 = 0;  // clip_grad_norm's total norm after the first backward
};

std::map<std::string, Tensor> full(nn::Module& m, bool grads) {
  std::map<std::string, Tensor> out;
  for (auto& [n, p] : m.named_parameters()) {
    Tensor t = grads ? p.grad() : p.detach();
    if (!t.defined()) continue;
    out[n] = t.is_distributed() ? full_tensor(t) : t.clone();
  }
  return out;
}

Run train(nn::Module& m, const MeshContext* ctx) {
  std::vector<Tensor> ps;
  for (auto& p : m.parameters())
    if (p.requires_grad()) ps.push_back(p);
  optim::AdamW adam(ps, optim::AdamWOptions{1e-2});
  const int64_t dp = ctx ? ctx->dp_size : 1, r = ctx ? ctx->dp_rank() : 0;
  auto world = DeviceMesh::world("loss").group(0);
  Run run;
  for (int step = 0; step < 5; ++step) {
    Tensor loss = loss_on(m, step, r, dp);
    loss.backward();
    if (step == 0) {
      run.grads0 = full(m, true);
      run.norm0 = clip_grad_norm(ps, 1e30);  // experts' grads sharded over (ep_shard, ep), the rest over dp
    }
    adam.step();
    adam.zero_grad();
    // sum over dp of loss / dp is the global loss; tp ranks repeat it
    Tensor l = from_vector<double>({loss.item<double>() / dp / (ctx ? ctx->tp_size : 1)}, {1});
    if (ctx) world->all_reduce(l, ReduceOp::SUM)->wait();
    run.losses.push_back(l.item<double>());
  }
  run.params = full(m, false);
  return run;
}

double worst_diff(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b, std::string& where) {
  double worst = 0;
  for (auto& [n, t] : a) {
    REQUIRE(b.count(n));
    REQUIRE(b.at(n).sizes() == t.sizes());
    const double d = amax(abs(sub(t, b.at(n)))).item<double>();
    if (d > worst) worst = d, where = n;
  }
  return worst;
}

struct Config {
  int64_t dp_replicate, tp, ep;
  std::string ac = "none";
  bool lora = false;
};

MeshContext make_ctx(const Config& c) {
  MeshContext ctx;
  ctx.world_size = world_size();
  ctx.tp_size = c.tp;
  ctx.dp_size = world_size() / c.tp;
  ctx.dp_replicate_size = c.dp_replicate;
  ctx.ep_size = c.ep;
  if (c.ac != "none") ctx.activation_checkpointing = checkpoint_policy_from_name(c.ac);
  ctx.validate("test");
  ctx.build_mesh();
  return ctx;
}

/// Bytes this rank's ep all-to-alls send in one forward, from the single-process routing of every
/// ep peer's rows: per MoE layer the counts (E int64), the rows it dispatches (M = tokens * k) and
/// the rows it sends back (those its experts received).
int64_t expected_forward_bytes(bool skewed, bool lora, const MeshContext& ctx) {
  const int64_t dp = ctx.dp_size, r = ctx.dp_rank(), ep = ctx.ep_size, El = kE / ep;
  const int64_t base = r - r % ep, me = r % ep;
  auto ref = make_net(skewed, lora);
  std::vector<std::vector<Shape>> counts(ep);  // [peer][layer] tokens per expert
  for (int64_t j = 0; j < ep; ++j) {
    NoGradGuard ng;
    loss_on(*ref, 0, base + j, dp);
    for (auto& moe : nn::moe_modules(*ref)) counts[j].push_back(moe->last_router_stats().tokens_per_expert);
  }
  int64_t bytes = 0;
  for (size_t l = 0; l < counts[me].size(); ++l) {
    int64_t sent = 0, received = 0;
    for (int64_t v : counts[me][l]) sent += v;
    for (int64_t j = 0; j < ep; ++j)
      for (int64_t e = me * El; e < (me + 1) * El; ++e) received += counts[j][l][e];
    bytes += kE * 8 + (sent + received) * kH * 8;
  }
  return bytes;
}

}  // namespace

TEST_CASE("expert parallelism equals the single-process run", "[ep][moe]") {
  const int64_t w = world_size();
  std::vector<Config> configs;
  if (w == 2) configs = {{1, 1, 2}, {1, 1, 2, "none", true}};
  if (w == 3) configs = {{1, 1, 3}, {1, 1, 3, "none", true}};
  if (w == 4) configs = {{1, 1, 4}, {1, 1, 2}, {1, 2, 2}, {2, 1, 2}, {1, 1, 2, "full"}, {1, 1, 2, "none", true}};
  for (bool skewed : {false, true}) {
    auto ref_model = make_net(skewed), ref_lora_model = make_net(skewed, true);
    const Run ref_base = train(*ref_model, nullptr), ref_lora = train(*ref_lora_model, nullptr);
    if (skewed) {  // the skew holds: expert 0 takes every token of layer 0, expert 11 none
      auto m = make_net(true);
      NoGradGuard ng;
      loss_on(*m, 0, 0, 1);
      const Shape c = nn::moe_modules(*m)[0]->last_router_stats().tokens_per_expert;
      CHECK(c[0] == kBatch * kSeq);
      CHECK(c[kE - 1] == 0);
    }
    for (const Config& c : configs) {
      INFO("skewed " << skewed << " dp_replicate " << c.dp_replicate << " tp " << c.tp << " ep " << c.ep << " ac "
                     << c.ac << " lora " << c.lora);
      MeshContext ctx = make_ctx(c);
      auto m = make_net(skewed, c.lora);
      parallelize_model(*m, ctx);
      // experts: Shard(0) over ep inside the FSDP placements, local E / ep experts' rows split over ep_shard
      const Tensor w1 = m->get_parameter("layers.0.mlp.experts.gate_up_proj");
      REQUIRE(w1.is_distributed());
      CHECK(w1.sizes() == Shape{kE, 2 * kI, kH});
      CHECK(device_mesh(w1).dim_names().back() == "ep");

      // the all-to-all bytes of one forward (a second copy: a no-grad forward leaves the units
      // that do not reshard after forward gathered, and train() collects m's parameters)
      auto pg = ctx.ep_mesh().group(0);
      {
        auto probe = make_net(skewed, c.lora);
        parallelize_model(*probe, ctx);
        pg->counters().reset();
        NoGradGuard ng;
        loss_on(*probe, 0, ctx.dp_rank(), ctx.dp_size);
      }
      CHECK(pg->counters().nbytes(CommKind::all_to_all) == expected_forward_bytes(skewed, c.lora, ctx));
      CHECK(pg->counters().count(CommKind::all_to_all) == 2 * 3);  // per layer: counts, dispatch, combine

      const Run got = train(*m, &ctx);
      const Run& ref = c.lora ? ref_lora : ref_base;
      for (size_t i = 0; i < ref.losses.size(); ++i) {
        INFO("step " << i << " single " << ref.losses[i] << " ep " << got.losses[i]);
        CHECK(std::abs(ref.losses[i] - got.losses[i]) <= kLossRelTol * std::abs(ref.losses[i]));
      }
      CHECK(got.norm0 == Approx(ref.norm0).epsilon(1e-12));
      std::string where;
      const double gd = worst_diff(ref.grads0, got.grads0, where);
      INFO("max |grad diff| " << gd << " at " << where);
      CHECK(gd <= kGradTol);
      const double pd = worst_diff(ref.params, got.params, where);
      INFO("max |param diff| " << pd << " at " << where);
      CHECK(pd <= kParamTol);
    }
  }
}

TEST_CASE("ep_size errors are one line naming the sizes", "[ep][moe]") {
  MeshContext ctx;
  ctx.world_size = 4;
  ctx.dp_size = 4;
  ctx.ep_size = 3;
  CHECK_THROWS_WITH(ctx.validate("distributed"), Catch::Contains("ep_size=3 does not divide dp_shard_cp") &&
                                                     Catch::Contains("= 4"));
  ctx.ep_size = 8;
  CHECK_THROWS_WITH(ctx.validate("distributed"), Catch::Contains("ep_size=8"));
  ctx.ep_size = 2;
  ctx.strategy = DataParallelStrategy::ddp;
  CHECK_THROWS_WITH(ctx.validate("distributed"), Catch::Contains("ddp does not support ep_size=2"));
  ctx.strategy = DataParallelStrategy::fsdp2;
  ctx.sequence_parallel = true;
  CHECK_THROWS_WITH(ctx.validate("distributed"), Catch::Contains("sequence_parallel"));
  ctx.sequence_parallel = false;
  CHECK_NOTHROW(ctx.validate("distributed"));
  if (world_size() == 2) {  // 12 experts, ep 2 fine; a net with 3 experts is not
    MeshContext c2 = make_ctx({1, 1, 2});
    nn::MoEConfig mc;
    mc.hidden_size = 4;
    mc.moe_intermediate_size = 3;
    mc.num_experts = 3;
    mc.num_experts_per_tok = 1;
    auto moe = std::make_shared<nn::MoE>(mc);
    CHECK_THROWS_WITH(apply_expert_parallel(*moe, c2.ep_mesh()),
                      Catch::Contains("num_experts=3, not divisible by distributed.ep_size=2"));
    nn::Linear dense(3, 3);
    CHECK_THROWS_WITH(parallelize_model(dense, c2), Catch::Contains("has no MoE block"));
  }
}
