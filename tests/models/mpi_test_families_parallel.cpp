// Every family (the tiny Qwen2, Qwen3, Mistral, Gemma 3 of tests/golden/<family>_debug) through
// its registered ModelParallelizer (parallelize_model from a MeshContext) equals the single
// process: losses of 5 AdamW steps (forward, backward, step) and every parameter after them, full
// fine-tune and LoRA. Meshes by world size: 2: TP 2 (with and without sequence parallelism),
// FSDP 2; 3: FSDP 3; 4: dp 2 x tp 2 (FSDP + TP), TP 4. Mistral and Gemma 3 have 1 kv head and
// Qwen2 / Qwen3 2, so TP 2 and TP 4 replicate kv heads across the ranks that share them
// (KVReplicateParallel); Qwen3's and Gemma 3's q_norm / k_norm stay replicated with their
// gradients reduced over tp.
#include <catch2/catch.hpp>

#include "dtensor/api.h"
#include "parallel/train_compare.h"
#include "models/lora/inject.h"
#include "models/transformer/load.h"
#include "models/transformer/parallelizer.h"
#include "parallel/model_parallelizer.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

constexpr int64_t kBatch = 12, kSeq = 12;  // 12 rows split over dp 1..4; 12 tokens > the windows (5)
/// The models run in f64: TP partial products and the dp reductions sum in other orders, which in
/// f32 AdamW amplifies for elements with near-zero gradients (up to 5e-5 here, 5% of a step, which
/// could hide a real difference); in f64 the same noise stays below 1e-12, so a tolerance of 1e-9
/// (1e-6 of one step, lr 1e-3) leaves no room for a wrong gradient.
constexpr double kParamTol = 1e-9;
constexpr double kLossRelTol = 1e-11;

const char* kFamilies[] = {"qwen2", "qwen3", "mistral", "gemma3"};

std::shared_ptr<CausalLM> make_model(const std::string& family, bool lora) {
  auto m = load_model_hf("tests/golden/" + family + "_debug", DType::f64);
  if (lora) {
    manual_seed(5);
    LoraConfig lc;
    lc.options.r = 4;
    lc.options.alpha = 8;
    apply_lora(*m, lc);
    NoGradGuard g;  // B starts at zero, which would leave A without gradient at step 1
    for (auto& [n, p] : m->named_parameters())
      if (n.find("lora_B") != std::string::npos) p.copy_(normal(p.sizes(), 0.0, 0.02, TensorOptions(p.dtype())));
  }
  return m;
}

/// Token ids [b1 - b0, kSeq] of global batch rows b0..b1 at step `step` (a fixed formula).
Tensor rows(int step, int64_t b0, int64_t b1) {
  std::vector<int64_t> ids;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t t = 0; t < kSeq; ++t) ids.push_back((b * 13 + t * 7 + step * 3 + (b * t) % 11) % 128);
  return from_vector<int64_t>(ids, {b1 - b0, kSeq});
}

struct Mesh {
  int64_t dp, tp;
  bool sp;
};

}  // namespace

TEST_CASE("families under TP, FSDP and FSDP + TP equal the single process", "[families][tp][fsdp]") {
  const int64_t w = world_size();
  std::vector<Mesh> meshes;
  if (w == 2) meshes = {{1, 2, false}, {1, 2, true}, {2, 1, false}};
  if (w == 3) meshes = {{3, 1, false}};
  if (w == 4) meshes = {{2, 2, false}, {1, 4, false}};
  for (const char* family : kFamilies) {
    for (bool lora : {false, true}) {
      auto ref_model = make_model(family, lora);
      const auto ref = testing::train_adamw(*ref_model, rows, kBatch, 0, 1, nullptr);
      for (const Mesh& mm : meshes) {
        INFO(family << " lora " << lora << " dp " << mm.dp << " x tp " << mm.tp << " sp " << mm.sp);
        MeshContext ctx;
        ctx.world_size = w;
        ctx.dp_size = mm.dp;
        ctx.tp_size = mm.tp;
        ctx.sequence_parallel = mm.sp;
        ctx.validate("test");
        ctx.build_mesh();
        auto m = make_model(family, lora);
        parallelize_model(*m, ctx);
        if (mm.tp > 1) {
          const Tensor& k = m->get_parameter(lora ? "model.layers.0.self_attn.k_proj.lora_A.weight"
                                                  : "model.layers.0.self_attn.k_proj.weight");
          const int64_t kv = m->config().num_key_value_heads;
          // kv heads split when tp divides them, else replicated (the last placement is tp's).
          const Placement tp_pl = placements(k).back();
          if (kv % mm.tp == 0 && !lora) CHECK(tp_pl.is_shard(0));
          if (mm.tp > kv) CHECK(tp_pl.is_replicate());
        }
        testing::check_same_run(
            ref, testing::train_adamw(*m, rows, kBatch, ctx.dp_rank(), ctx.dp_size, {}),
            kLossRelTol, kParamTol);
      }
    }
  }
}

TEST_CASE("family parallelizers are registered and check heads against tp", "[families][tp]") {
  for (const char* family : kFamilies) {
    INFO(family);
    auto m = make_model(family, false);
    auto p = parallelizer_for(*m);
    REQUIRE(dynamic_cast<DecoderParallelizer*>(p.get()) != nullptr);
    p->validate_tp_mesh(*m, 2);
    p->validate_tp_mesh(*m, 4);  // 4 query heads; kv heads 1 or 2 replicated
    CHECK_THROWS_WITH(p->validate_tp_mesh(*m, 3), Catch::Contains("tp_size=3") && Catch::Contains("num_attention_heads=4"));
  }
}
