// The debug Llama with LoRA under tensor parallelism (the Llama TP plan, with and without
// sequence parallelism) equals the single-process model: loss and every LoRA gradient. Also
// the heads % tp check of the Llama parallelizer.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/parallelizer.h"
#include "models/lora/inject.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::max_abs_diff;

namespace {

/// f32 model: distributed and single process differ in summation order only; 2e-5 covers the
/// f32 rounding of the sums in attention / matmul over the debug model's sizes.
constexpr double kTolLoss = 2e-5;
constexpr double kTolGrad = 2e-5;

std::shared_ptr<LlamaForCausalLM> make_model() {
  manual_seed(123);
  auto m = std::make_shared<LlamaForCausalLM>(llama_debug_config());
  LoraConfig lc;
  lc.options.r = 4;
  lc.options.alpha = 8;
  apply_lora(*m, lc);
  // Non-zero B so that A receives a gradient.
  NoGradGuard ng;
  for (auto& [fqn, p] : m->named_parameters())
    if (fqn.find("lora_B") != std::string::npos) p.copy_(uniform(p.sizes(), -0.05, 0.05));
  return m;
}

/// dp = world / tp, the rest default.
MeshContext tp_ctx(int64_t tp, bool sequence_parallel, int64_t world) {
  MeshContext c;
  c.world_size = world;
  c.tp_size = tp;
  c.sequence_parallel = sequence_parallel;
  c.infer_dp_size("test");
  c.validate("test");
  return c;
}

}  // namespace

TEST_CASE("Llama parallelizer checks heads against tp", "[llama][tp]") {
  auto m = make_model();
  LlamaParallelizer p;
  p.validate_tp_mesh(*m, 2);
  CHECK_THROWS_WITH(p.validate_tp_mesh(*m, 3), Catch::Contains("tp_size=3") && Catch::Contains("num_attention_heads=4"));
  p.validate_tp_mesh(*m, 4);  // 2 kv heads over 4 ranks: each kv head replicated on 2 ranks
  ModelConfig c = llama_debug_config();
  c.num_attention_heads = 12;  // hidden 64 with head_dim 16 given explicitly
  c.num_key_value_heads = 4;
  CHECK_THROWS_WITH(check_tp_heads(c, 6, "test"), Catch::Contains("num_key_value_heads=4") && Catch::Contains("tp_size=6"));
  check_tp_heads(c, 2, "test");
  check_tp_heads(c, 12, "test");
  CHECK(parallelizer_for(*m) != nullptr);
}

TEST_CASE("Llama + LoRA under the TP plan equals the single process", "[llama][tp]") {
  const int w = world_size();
  const int64_t tp = (w % 2 == 0) ? 2 : 1;
  DeviceMesh mesh({w / tp, tp}, {"dp", "tp"});
  const DeviceMesh tp_mesh = mesh["tp"];
  const int64_t B = 2, V = llama_debug_config().vocab_size;
  // T = 7 and 3: sequence shards of uneven torch.chunk sizes on tp 2 (4 + 3, 2 + 1).
  for (int64_t T : {8, 7, 3})
  for (bool sp : {false, true}) {
    if (!sp && T != 8) continue;
    INFO("sequence_parallel " << sp << " tp " << tp << " T " << T);
    manual_seed(7);
    Tensor ids = to_dtype(mul(rand({B, T}), static_cast<double>(V - 1)), DType::i64);
    auto ref = make_model();
    Tensor loss_ref = ref->forward_loss(ids, ids);
    loss_ref.backward();

    auto m = make_model();
    MeshContext ctx;
    ctx.sequence_parallel = sp;
    ctx.tp_size = tp;
    LlamaParallelizer p;
    ParallelizePlan plan = p.tp_plan(*m, ctx);
    translate_to_lora(plan);
    parallelize_module(*m, tp_mesh, plan);
    Tensor loss = m->forward_loss(ids, ids);
    Tensor loss_full = loss.is_distributed() ? full_tensor(loss) : loss;
    CHECK(std::abs(loss_full.item<double>() - loss_ref.item<double>()) < kTolLoss);
    loss.backward();
    auto rp = ref->named_parameters(), tpp = m->named_parameters();
    REQUIRE(rp.size() == tpp.size());
    int checked = 0;
    for (size_t i = 0; i < rp.size(); ++i) {
      INFO(rp[i].first);
      CHECK(rp[i].second.requires_grad() == tpp[i].second.requires_grad());
      if (!rp[i].second.grad().defined()) {
        CHECK_FALSE(tpp[i].second.grad().defined());
        continue;
      }
      REQUIRE(tpp[i].second.grad().defined());
      Tensor g = tpp[i].second.grad();
      if (g.is_distributed()) g = full_tensor(g);
      CHECK(max_abs_diff(g, rp[i].second.grad()) < kTolGrad);
      ++checked;
    }
    CHECK(checked == 2 * 7 * 2);  // 2 layers x 7 projections x (lora_A, lora_B)
  }
}

TEST_CASE("parallelize_model: Llama + LoRA on dp x tp equals the single process", "[llama][tp][dp]") {
  const int w = world_size();
  const int64_t tp = (w % 2 == 0) ? 2 : 1;
  // Sequence parallel with T = 7 (uneven shards on tp 2): TP only on 2 ranks, FSDP + TP on 4.
  for (bool sp : {false, true}) {
  INFO("sequence_parallel " << sp);
  MeshContext ctx = tp_ctx(tp, sp, w);
  ctx.build_mesh();
  const int64_t dp = ctx.dp_size, per = 2, B = per * dp, T = sp ? 7 : 8, V = llama_debug_config().vocab_size;
  manual_seed(11);
  Tensor ids = to_dtype(mul(rand({B, T}), static_cast<double>(V - 1)), DType::i64);
  auto ref = make_model();
  ref->forward_loss(ids, ids).backward();

  auto m = make_model();
  parallelize_model(*m, ctx);
  Tensor mine = narrow(ids, 0, ctx.dp_rank() * per, per).contiguous();
  Tensor loss = m->forward_loss(mine, mine);  // token mean of this rank's equal-size slice
  loss.backward();  // the end-of-backward callbacks average the gradients over dp
  auto rp = ref->named_parameters(), mp = m->named_parameters();
  REQUIRE(rp.size() == mp.size());
  for (size_t i = 0; i < rp.size(); ++i) {
    if (!rp[i].second.grad().defined()) continue;
    INFO(rp[i].first);
    REQUIRE(mp[i].second.grad().defined());
    Tensor g = mp[i].second.grad();
    if (g.is_distributed()) g = full_tensor(g);
    CHECK(max_abs_diff(g, rp[i].second.grad()) < kTolGrad);
  }
  }
}

TEST_CASE("distributed.tp_plan equal to the Llama sidecar's plan: same result as the sidecar and the single process",
          "[llama][tp][tp_plan]") {
  const int w = world_size();
  if (w % 2 != 0) return;  // TP 2 on 2 ranks, dp 2 x tp 2 on 4
  // Hugging Face's LlamaForCausalLM base_model_tp_plan as style names (lm_head colwise_rep: the
  // loss-parallel lm_head, as Automodel translates it).
  const std::vector<std::pair<std::string, std::string>> plan{
      {"model.embed_tokens", "embedding_rowwise"},  {"model.layers.*.self_attn.q_proj", "colwise"},
      {"model.layers.*.self_attn.k_proj", "colwise"}, {"model.layers.*.self_attn.v_proj", "colwise"},
      {"model.layers.*.self_attn.o_proj", "rowwise"}, {"model.layers.*.mlp.gate_proj", "colwise"},
      {"model.layers.*.mlp.up_proj", "colwise"},      {"model.layers.*.mlp.down_proj", "rowwise"},
      {"lm_head", "colwise_rep"}};
  const int64_t per = 2, T = 8, V = llama_debug_config().vocab_size;
  manual_seed(11);
  Tensor ids = to_dtype(mul(rand({per * (w / 2), T}), static_cast<double>(V - 1)), DType::i64);
  auto ref = make_model();
  Tensor loss_ref = ref->forward_loss(ids, ids);
  loss_ref.backward();
  std::map<bool, std::map<std::string, Tensor>> grads;
  for (bool recipe : {false, true}) {
    INFO((recipe ? "distributed.tp_plan" : "sidecar plan") << ", dp " << w / 2 << " x tp 2");
    MeshContext ctx = tp_ctx(2, false, w);
    if (recipe) ctx.tp_plan = plan;
    REQUIRE(ctx.tp_plan.size() == (recipe ? 9u : 0u));
    ctx.build_mesh();
    auto m = make_model();
    parallelize_model(*m, ctx);
    Tensor mine = narrow(ids, 0, ctx.dp_rank() * per, per).contiguous();
    Tensor loss = m->forward_loss(mine, mine);
    loss.backward();
    Tensor l = loss.is_distributed() ? full_tensor(loss) : loss;
    if (ctx.dp_size > 1) {  // this rank's slice: the mean over dp is the whole batch's token mean
      l = l.clone();
      ctx.dp_mesh().group(0)->all_reduce(l, ReduceOp::AVG)->wait();
    }
    CHECK(std::abs(l.item<double>() - loss_ref.item<double>()) < kTolLoss);
    for (auto& [fqn, p] : ref->named_parameters()) {
      if (!p.grad().defined()) continue;
      INFO(fqn);
      Tensor g = m->get_parameter(fqn).grad();
      REQUIRE(g.defined());
      g = g.is_distributed() ? full_tensor(g) : g;
      CHECK(max_abs_diff(g, p.grad()) < kTolGrad);
      grads[recipe][fqn] = g;
    }
  }
  for (auto& [fqn, g] : grads[false]) {
    INFO(fqn);
    CHECK(max_abs_diff(grads[true].at(fqn), g) == 0.0);  // the same styles: the same sums
  }
  // A plan that would split Llama's 2 kv heads over 4 ranks is refused (the sidecar replicates them).
  if (w == 4) {
    MeshContext ctx = tp_ctx(4, false, w);
    ctx.tp_plan = plan;
    ctx.build_mesh();
    CHECK_THROWS_WITH(parallelize_model(*make_model(), ctx),
                      Catch::Contains("self_attn.k_proj colwise with distributed.tp_size=4 > num_key_value_heads=2"));
  }
}
