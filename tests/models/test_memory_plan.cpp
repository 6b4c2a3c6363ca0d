// The memory / comm plan of --dry-run (models/transformer/memory_plan.h) against formulas:
// ZeRO-3 mixed-precision AdamW state 16 x params / N, Korthikanti et al.'s no-AC activation
// formula (with the terms dtr stores differently named), FSDP bytes per step as
// tests/parallel/test_fsdp_comm.cpp counts them, and built-in shapes' parameter counts.
#include <catch2/catch.hpp>

#include "models/lora/inject.h"
#include "models/transformer/memory_plan.h"
#include "parallel/activation_checkpoint.h"
#include "tensor/meta.h"

using namespace dtr;

namespace {

MeshContext mesh(int64_t world, int64_t dp, int64_t tp) {
  MeshContext ctx;
  ctx.world_size = world;
  ctx.dp_size = dp;
  ctx.tp_size = tp;
  ctx.validate("test");
  return ctx;
}

std::shared_ptr<CausalLM> meta_model(const ModelConfig& c, DType dt) {
  MetaInitGuard g;
  return std::make_shared<CausalLM>(c, dt, false);
}

}  // namespace

TEST_CASE("memory plan: ZeRO-3 mixed-precision AdamW holds 16 x params / N bytes per rank", "[memory_plan]") {
  auto m = meta_model(builtin_model_config("llama3_8b"), DType::f32);
  for (int64_t n : {8, 64, 512}) {
    MeshContext ctx = mesh(n, n, 1);
    ctx.mp_policy.param_dtype = DType::bf16;
    ctx.mp_policy.reduce_dtype = DType::f32;
    const MemoryPlan p = plan_memory(*m, ctx, {1, 2048, 1}, DType::f32);
    CHECK(p.params == 8030261248);  // Llama-3-8B (HF: 8.03B)
    const double state = p.param_bytes + p.grad_bytes + p.optimizer_bytes;
    const double zero3 = 16.0 * static_cast<double>(p.params) / static_cast<double>(n);
    INFO("N " << n << ": " << state << " vs " << zero3);
    CHECK(state >= zero3);
    CHECK(state <= zero3 * 1.001);  // FSDP pads each tensor to ceil(rows / N) rows
  }
}

TEST_CASE("memory plan: no-AC activations are Megatron's formula less what dtr does not store", "[memory_plan]") {
  // GPT-like shape: MHA (kv = heads), bf16 activations, no LoRA. Korthikanti et al. per layer:
  // s b h (34 + 5 a s / h) at t = 1: attention 11 sbh + 5 a s^2 b (2 input, 4 q k, 2 v, 2 out-proj
  // input, 1 dropout mask; scores 2 + softmax 2 + mask 1 per a s^2 b), MLP 19 sbh (2 input,
  // 8 + 8 GeLU in / out, 1 mask), norms 4 sbh. dtr: fused attention keeps the logsumexp (a per
  // token, 2 bytes) instead of the a s^2 terms, no dropout masks (dropout 0), SwiGLU keeps gate,
  // up and its output (3 I per token) instead of the 16 sbh GeLU terms.
  ModelConfig c = builtin_model_config("llama3_8b");
  c.num_key_value_heads = c.num_attention_heads;
  c.num_hidden_layers = 4;
  c.layer_types.assign(4, "full_attention");
  auto m = meta_model(c, DType::f32);
  const int64_t s = 1024, b = 2, h = c.hidden_size, a = c.num_attention_heads, I = c.intermediate_size;
  for (int64_t t : {1, 2, 8}) {
    MeshContext ctx = mesh(t, 1, t);
    ctx.mp_policy.param_dtype = DType::bf16;
    const MemoryPlan p = plan_memory(*m, ctx, {b, s, 1}, DType::f32);
    const double sb = static_cast<double>(s * b), T = static_cast<double>(t);
    // Megatron with t: s b h (10 + 24 / t + 5 a s / (h t)): 10 = 4 norms + 2 attention input +
    // 2 MLP input + 2 dropout masks (replicated); 24 / t: 4 q k + 2 v + 2 out + 16 MLP; 5as/(ht) scores.
    const double megatron = megatron_activation_bytes(s, b, h, a, t, false);
    const double expect = megatron - sb * h * (2.0 + 16.0 / T) - sb * 5.0 * a * s / T  // masks, GeLU terms, scores
                          + sb * 2.0 * a / T + sb * 2.0 * 3.0 * I / T;              // lse, SwiGLU terms
    const double per_layer = (p.activation_bytes - sb * 2.0 * 2.0 * h) / 4.0;  // less final norm + lm_head input
    INFO("t " << t << ": dtr " << per_layer << " vs Megatron-derived " << expect << " (Megatron " << megatron << ")");
    CHECK(per_layer == Approx(expect).epsilon(1e-12));
  }
  CHECK(megatron_activation_bytes(2048, 1, 4096, 32, 1, false) == Approx(2048.0 * 4096 * (34 + 5.0 * 32 * 2048 / 4096)));
  CHECK(megatron_activation_bytes(2048, 1, 4096, 32, 8, true) ==
        Approx(megatron_activation_bytes(2048, 1, 4096, 32, 1, false) / 8));
}

TEST_CASE("memory plan: FSDP bytes per step as the FSDP tests count them", "[memory_plan]") {
  ModelConfig c = llama_debug_config();
  auto m = meta_model(c, DType::f32);
  for (int64_t n : {2, 3, 4}) {
    for (int64_t accum : {1, 4}) {
      MeshContext ctx = mesh(n, n, 1);
      const MemoryPlan p = plan_memory(*m, ctx, {2, 16, accum}, DType::f32);
      // Units: each layer, and the root (embed, norm, lm_head). Forward gathers every unit, backward
      // the layers resharded after forward (all but the last); one reduce-scatter per unit per step
      // (defer_fsdp_grad_sync) of n padded segments.
      double ag = 0, rs = 0;
      std::map<std::string, double> shard;
      for (const auto& [fqn, t] : m->named_parameters()) {
        const std::string unit = fqn.rfind("model.layers.", 0) == 0 ? fqn.substr(0, fqn.find('.', 13)) : "";
        shard[unit] += static_cast<double>((t.size(0) + n - 1) / n * (t.numel() / t.size(0)));
      }
      for (const auto& [unit, e] : shard) {
        const bool resharded = unit == "model.layers.0";
        ag += static_cast<double>(accum) * (resharded ? 2 : 1) * e * 4;
        rs += static_cast<double>(n) * e * 4;
      }
      INFO("n " << n << " accum " << accum);
      CHECK(p.comm.at("dp_shard").all_gather == ag);
      CHECK(p.comm.at("dp_shard").reduce_scatter == rs);
      CHECK(p.comm.at("dp_shard").all_reduce == 0);
    }
  }
}

TEST_CASE("memory plan: built-in shapes and LoRA counts", "[memory_plan]") {
  CHECK(meta_model(builtin_model_config("llama3_70b"), DType::bf16)->named_parameters().size() == 723);
  auto m = meta_model(builtin_model_config("llama3_70b"), DType::bf16);
  int64_t n = 0;
  for (const auto& [f, p] : m->named_parameters()) n += p.numel();
  CHECK(n == 70553706496);  // Llama-3-70B (HF: 70.55B)
  {
    MetaInitGuard g;
    LoraConfig lc;
    lc.options.r = 16;
    apply_lora(*m, lc);
  }
  MeshContext ctx = mesh(64, 8, 8);
  ctx.activation_checkpointing = CheckpointPolicy::full;
  const MemoryPlan p = plan_memory(*m, ctx, {1, 4096, 8}, DType::bf16);
  CHECK(p.trainable == 207093760);  // r 16 on q, k, v, o, gate, up, down of 80 layers
  CHECK(p.comm.count("tp") == 1);
  CHECK_THROWS_WITH(builtin_model_config("llama9"), Catch::Contains("llama3_70b"));
}
