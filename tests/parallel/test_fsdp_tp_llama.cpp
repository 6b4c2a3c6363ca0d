// FSDP + TP on the debug Llama (full fine-tune and LoRA with a frozen base): the Llama TP plan
// (LoRA-aware styles) on the tp dim, fully_shard per decoder layer / untied embedding / root on
// the (dp_shard, tp) mesh; 5 AdamW steps equal the single-process run (losses and full_tensor of
// every parameter). 4 ranks: 2x2 by hand and through parallelize_model (MeshContext dp 2 x tp 2,
// selective activation checkpointing; a recipe tp_plan leaving embed_tokens / lm_head plain, on
// dp 2 x tp 2 and HSDP 2 x 1 x tp 2); 2 ranks: 2x1, 1x2; 3 ranks: 3x1 (4 heads: tp 3 invalid).
#include <catch2/catch.hpp>

#include "dtensor/api.h"
#include "llama_test_util.h"
#include "train_compare.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/parallelizer.h"
#include "models/lora/inject.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/model_parallelizer.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

constexpr int64_t kBatch = 24, kSeq = 8;
/// f32: TP partial products and the dp reduce-scatter sum in other orders (~1 ulp per op); AdamW
/// divides by sqrt(v), so elements with near-zero gradients amplify that noise. Measured max
/// |param diff| 7.1e-6 (2 ranks), 4.7e-6 (3x1), 5.4e-6 (2x2), like the 1-d FSDP Llama test.
/// 2e-5 is 2% of one step (lr 1e-3): a wrong gradient moves parameters by whole steps and
/// cannot pass.
constexpr double kParamTol = 2e-5;
constexpr double kLossRelTol = 1e-6;

std::shared_ptr<LlamaForCausalLM> make_llama(bool lora) { return testing::make_debug_llama(lora); }

Tensor rows(int step, int64_t b0, int64_t b1) { return testing::debug_token_rows(step, b0, b1, kSeq); }

testing::TrainRun train(LlamaForCausalLM& m, int64_t dp_rank, int64_t dp, const std::function<void()>& finish) {
  return testing::train_adamw(m, rows, kBatch, dp_rank, dp, finish);
}

void check_equal(const testing::TrainRun& ref, const testing::TrainRun& got) {
  testing::check_same_run(ref, got, kLossRelTol, kParamTol);
}

}  // namespace

TEST_CASE("FSDP + TP: debug Llama (full fine-tune and LoRA) equals the single-process run", "[fsdp][tp][llama]") {
  const int64_t w = world_size();
  std::vector<std::pair<int64_t, int64_t>> meshes;  // (dp_shard, tp)
  if (w == 4) meshes = {{2, 2}};
  if (w == 2) meshes = {{2, 1}, {1, 2}};
  if (w == 3) meshes = {{3, 1}};
  if (w == 1) meshes = {{1, 1}};
  for (bool lora : {false, true}) {
    auto ref_model = make_llama(lora);
    const testing::TrainRun ref = train(*ref_model, 0, 1, nullptr);
    for (auto [dp, tp] : meshes) {
      INFO("lora " << lora << " mesh " << dp << "x" << tp);
      DeviceMesh mesh({dp, tp}, {"dp_shard", "tp"});
      auto m = make_llama(lora);
      LlamaParallelizer par;
      MeshContext ctx;
      ctx.tp_size = tp;
      ParallelizePlan plan = par.tp_plan(*m, ctx);
      translate_to_lora(plan);
      parallelize_module(*m, mesh["tp"], plan);
      par.after_tp(*m, ctx);
      auto layers = par.layers(*m);
      for (size_t i = 0; i < layers.size(); ++i) {
        FSDPOptions o;
        o.reshard_after_forward = i + 1 != layers.size();
        fully_shard(*layers[i].second, mesh, o);
      }
      for (auto& [fqn, u] : par.extra_units(*m)) fully_shard(*u, mesh);
      FSDPOptions root;
      root.reshard_after_forward = false;
      fully_shard(*m, mesh, root);
      // Every parameter is a DTensor on the 2-d mesh; frozen ones stay frozen.
      int frozen = 0;
      for (auto& [fqn, p] : m->named_parameters()) {
        INFO(fqn);
        REQUIRE(p.is_distributed());
        CHECK(device_mesh(p).ndim() == 2);
        frozen += p.requires_grad() ? 0 : 1;
      }
      CHECK((frozen > 0) == lora);
      check_equal(ref, train(*m, mesh.coordinate(0), dp, {}));
    }
    if (w == 4) {
      // The wired path: a recipe's dp 2 x tp 2 uses FSDP + TP, here with selective AC.
      INFO("lora " << lora << " parallelize_model dp 2 x tp 2, selective AC");
      MeshContext ctx;
      ctx.world_size = 4;
      ctx.dp_size = 2;
      ctx.tp_size = 2;
      ctx.activation_checkpointing = CheckpointPolicy::selective;
      ctx.validate("test");
      ctx.build_mesh();
      auto m = make_llama(lora);
      parallelize_model(*m, ctx);
      REQUIRE(fsdp_param_group(*m) != nullptr);
      const Tensor& q = m->get_parameter("model.layers.0.self_attn.q_proj.weight");
      CHECK(placements(q) == Placements{StridedShard(0, 2), Shard(0)});
      check_equal(ref, train(*m, ctx.dp_rank(), ctx.dp_size, {}));
    }
    if (w == 4 && !lora) {
      // A recipe tp_plan that leaves the untied embed_tokens / lm_head plain: those units are
      // replicated over tp and sharded over the dp dims only (FSDP2's fully_shard(unit,
      // mesh[dp dims])), on dp 2 x tp 2 and on HSDP 2 x 1 x tp 2 (a 3-d full mesh).
      const std::vector<std::pair<std::string, std::string>> plan{
          {"model.layers.*.self_attn.q_proj", "colwise"}, {"model.layers.*.self_attn.k_proj", "colwise"},
          {"model.layers.*.self_attn.v_proj", "colwise"}, {"model.layers.*.self_attn.o_proj", "rowwise"},
          {"model.layers.*.mlp.gate_proj", "colwise"},    {"model.layers.*.mlp.up_proj", "colwise"},
          {"model.layers.*.mlp.down_proj", "rowwise"}};
      for (int64_t replicate : {1, 2}) {
        INFO("tp_plan without embed_tokens / lm_head, dp 2 (replicate " << replicate << ") x tp 2");
        MeshContext ctx;
        ctx.world_size = 4;
        ctx.dp_size = 2;
        ctx.dp_replicate_size = replicate;
        ctx.tp_size = 2;
        ctx.tp_plan = plan;
        ctx.validate("test");
        ctx.build_mesh();
        auto m = make_llama(false);
        parallelize_model(*m, ctx);
        for (const char* fqn : {"model.embed_tokens.weight", "lm_head.weight"}) {
          INFO(fqn);
          const Tensor& t = m->get_parameter(fqn);
          REQUIRE(t.is_distributed());
          CHECK(device_mesh(t).dim_names() == ctx.fsdp_mesh().dim_names());
        }
        check_equal(ref, train(*m, ctx.dp_rank(), ctx.dp_size, {}));
      }
    }
  }
}
