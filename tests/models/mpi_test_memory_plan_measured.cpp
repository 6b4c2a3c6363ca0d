// The --dry-run memory plan (models/transformer/memory_plan.h) against the allocator: a real
// training step (forward, backward, FSDP's reduce-scatter, clip_grad_norm, AdamW) of a
// meta-built Llama-shaped model under parallelize_model on 1-4 ranks, its peak live bytes per
// rank (the figure dtr-train reports as peak_mem_bytes) within 10% of the plan's peak, and the
// backward's peak within 10% of the plan's backward points, for
// LoRA under FSDP, full fine-tuning under FSDP (no AC and full AC; 2 micro-batches with the
// gradients held to the last one or reduced after each) and TP (+ FSDP); the load
// phase's peak against the plan's; and the plan's TP (+ SP) and DDP bytes per step equal to the
// process-group counters of a real step (2-4 ranks, uneven sequence shards on 3); a pipeline
// step (pp = world, 1F1B, LoRA and full fine-tuning, tied table; pp 2 x dp 2 with FSDP in the
// stages on 4 ranks) against the pp plan.
#include <catch2/catch.hpp>

#include <cstdio>

#include "models/lora/inject.h"
#include "models/transformer/memory_plan.h"
#include "models/transformer/pipeline_stage.h"
#include "parallel/clip_grad.h"
#include "parallel/model_parallelizer.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/parallelize_stage.h"
#include "parallel/pipeline/stage_fsdp.h"
#include "parallel/pipeline/tied_weights.h"
#include "runtime/env.h"
#include "tensor/allocator.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

/// SmolLM2-like proportions at a size that steps in milliseconds: the tied / untied table of a
/// 4096 vocabulary, 6 heads (tp 2 and 3 divide them), SwiGLU 3 x hidden.
ModelConfig plan_test_config(bool tied) {
  ModelConfig c = llama_debug_config();
  c.vocab_size = 4096;
  c.hidden_size = 192;
  c.intermediate_size = 512;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 6;
  c.tie_word_embeddings = tied;
  c.layer_types.assign(4, "full_attention");
  return c;
}

/// The model built on meta tensors (seed 11), with rank-8 LoRA on every *_proj when `lora`.
std::shared_ptr<CausalLM> meta_model(const ModelConfig& c, bool lora) {
  MetaInitGuard g;
  manual_seed(11);
  auto m = std::make_shared<CausalLM>(c);
  if (lora) {
    LoraConfig lc;
    lc.options.r = 8;
    lc.options.alpha = 16;
    apply_lora(*m, lc);
  }
  return m;
}

struct Case {
  std::string name;
  bool lora, tied;
  int64_t dp, tp;
  std::optional<CheckpointPolicy> ac;
  int64_t micro = 1;  // micro-batches per step
  bool defer = true;  // defer_fsdp_grad_sync: FSDP holds the unsharded gradients until the last one
};

std::vector<Case> cases() {
  const int64_t w = world_size();
  const int64_t tp = w == 4 ? 2 : w;  // TP case: tp 2 x dp 2 on 4 ranks, tp alone on 2 / 3
  return {{"LoRA FSDP", true, true, w, 1, std::nullopt},
          {"full FT FSDP", false, false, w, 1, std::nullopt},
          {"full FT FSDP, full AC", false, false, w, 1, CheckpointPolicy::full},
          {"TP + FSDP", false, false, w / tp, tp, std::nullopt},
          {"full FT FSDP, 2 micro-batches held", false, false, w, 1, std::nullopt, 2, true},
          {"full FT FSDP, 2 micro-batches reduced each", false, false, w, 1, std::nullopt, 2, false}};
}

}  // namespace

TEST_CASE("dry-run plan: predicted peak memory per rank within 10% of a real step's", "[memory_plan]") {
  const int64_t B = 2, S = 128;
  for (const Case& k : cases()) {
    const ModelConfig c = plan_test_config(k.tied);
    MeshContext ctx;
    ctx.world_size = world_size();
    ctx.dp_size = k.dp;
    ctx.tp_size = k.tp;
    ctx.activation_checkpointing = k.ac;
    ctx.defer_fsdp_grad_sync = k.defer;
    ctx.validate("test");
    ctx.build_mesh();
    reset_peak_memory();
    const int64_t before = memory_stats().current;
    std::shared_ptr<CausalLM> m = meta_model(c, k.lora);
    const MemoryPlan plan = plan_memory(*m, ctx, {B, S, k.micro}, DType::f32);
    parallelize_model(*m, ctx);
    const double load_peak = static_cast<double>(memory_stats().peak - before);
    std::vector<Tensor> params;
    for (const auto& [n, p] : m->named_parameters())
      if (p.requires_grad()) params.push_back(p);
    optim::AdamW opt(params);
    std::vector<int64_t> v;
    for (int64_t i = 0; i < B * S; ++i) v.push_back((i * 7 + rank() * 3) % c.vocab_size);
    const Tensor ids = from_vector<int64_t>(v, {B, S});
    double fwd_peak = 0, fwd_end = 0, bwd_peak = 0, opt_peak = 0, base = 0;
    auto step = [&] {
      const int64_t b0 = memory_stats().current;
      fwd_peak = fwd_end = bwd_peak = 0;
      for (int64_t mb = 0; mb < k.micro; ++mb) {
        set_model_gradient_sync(*m, ctx, mb == k.micro - 1);  // as dtr-train's train_step
        reset_peak_memory();
        // As dtr-train's micro_batch: the loss through the fused head.
        Tensor loss = causal_lm_loss(*m, ids, ids, false);
        fwd_peak = std::max(fwd_peak, static_cast<double>(memory_stats().peak - before));
        fwd_end = std::max(fwd_end, static_cast<double>(memory_stats().current - before));
        reset_peak_memory();
        loss.backward();
        loss = Tensor();
        bwd_peak = std::max(bwd_peak, static_cast<double>(memory_stats().peak - before));
      }
      reset_peak_memory();
      clip_grad_norm(params, 1.0);
      opt.step();
      opt.zero_grad();
      opt_peak = static_cast<double>(memory_stats().peak - before);
      base = static_cast<double>(b0 - before);
    };
    step();  // warm-up: AdamW's state, FSDP's forward order
    step();
    const double measured = std::max({fwd_peak, bwd_peak, opt_peak});
    if (rank() == 0)
      std::printf("[%lld ranks] %s: plan peak %.3f MiB (params %.3f grads %.3f opt %.3f gathered %.3f fsdp grads %.3f "
                  "acts %.3f logits %.3f) | measured peak %.3f MiB (base %.3f, forward peak %.3f end %.3f, backward "
                  "%.3f, optimizer %.3f); backward plan %.3f; load plan %.3f measured %.3f\n",
                  (long long)world_size(), k.name.c_str(), plan.peak_bytes / 1048576, plan.param_bytes / 1048576,
                  plan.grad_bytes / 1048576, plan.optimizer_bytes / 1048576, plan.fsdp_gathered_bytes / 1048576,
                  plan.fsdp_grad_bytes / 1048576, plan.activation_bytes / 1048576, plan.logits_bytes / 1048576,
                  measured / 1048576, base / 1048576, fwd_peak / 1048576, fwd_end / 1048576, bwd_peak / 1048576,
                  opt_peak / 1048576, plan.backward_peak_bytes / 1048576, plan.load_peak_bytes / 1048576,
                  load_peak / 1048576);
    INFO(k.name << " on " << world_size() << " ranks: plan " << plan.peak_bytes << " measured " << measured);
    CHECK(plan.peak_bytes == Approx(measured).epsilon(0.10));
    // The backward on its own (FSDP's reductions in flight, the gradients so far): 2-8% here.
    CHECK(plan.backward_peak_bytes == Approx(bwd_peak).epsilon(0.10));
    CHECK(plan.load_peak_bytes == Approx(load_peak).epsilon(0.10));
  }
}

TEST_CASE("dry-run plan: TP (+ SP) and DDP bytes per step equal the process-group counters of a real step",
          "[memory_plan]") {
  const int64_t w = world_size();
  if (w < 2) return;
  const int64_t B = 2, S = 16;
  const ModelConfig c = plan_test_config(false);
  struct Comm {
    std::string name;
    int64_t dp, tp;
    bool sp, ddp;
  };
  std::vector<Comm> comms = {{"DDP", w, 1, false, true}};
  if (w == 2 || w == 3) {
    comms.push_back({"TP", 1, w, false, false});
    comms.push_back({"TP + SP", 1, w, true, false});
  }
  if (w == 4) {
    comms.push_back({"FSDP 2 x TP 2", 2, 2, false, false});
    comms.push_back({"FSDP 2 x TP 2 + SP", 2, 2, true, false});
  }
  for (const Comm& k : comms) {
    MeshContext ctx;
    ctx.world_size = w;
    ctx.dp_size = k.dp;
    ctx.tp_size = k.tp;
    ctx.sequence_parallel = k.sp;
    if (k.ddp) ctx.strategy = DataParallelStrategy::ddp;
    ctx.validate("test");
    ctx.build_mesh();
    std::shared_ptr<CausalLM> m;
    {
      MetaInitGuard g;
      manual_seed(5);
      m = std::make_shared<CausalLM>(c);
    }
    const MemoryPlan plan = plan_memory(*m, ctx, {B, S, 1}, DType::f32);
    parallelize_model(*m, ctx);
    std::vector<int64_t> v;
    for (int64_t i = 0; i < B * S; ++i) v.push_back((i * 7 + ctx.dp_rank() * 3) % c.vocab_size);
    const Tensor ids = from_vector<int64_t>(v, {B, S});
    auto step = [&] {
      Tensor loss = causal_lm_loss(*m, ids, ids, false);
      loss.backward();
    };
    step();  // warm-up
    CommCounters& cnt = (k.ddp ? ctx.dp_mesh() : ctx.tp_mesh()).group(0)->counters();
    cnt.reset();
    step();
    const CommVolume& want = plan.comm.at(k.ddp ? "dp" : "tp");
    INFO(k.name << " on " << w << " ranks");
    CHECK(static_cast<double>(cnt.nbytes(CommKind::all_reduce)) == want.all_reduce);
    CHECK(static_cast<double>(cnt.nbytes(CommKind::reduce_scatter)) == want.reduce_scatter);
    CHECK(static_cast<double>(cnt.nbytes(CommKind::all_gather)) == want.all_gather);
    m.reset();
  }
}

TEST_CASE("dry-run plan: a pipeline step's peak memory (pp = world; pp 2 x dp 2) within 10% of the plan's",
          "[memory_plan]") {
  const int w = world_size();
  if (w < 2) return;
  const int64_t S = 128;
  std::vector<std::pair<int, bool>> runs;  // (pp, LoRA); dp = world / pp (FSDP in the stages)
  for (const bool lora : {true, false}) runs.push_back({w, lora});
  if (w == 4) runs.push_back({2, true});
  for (const auto& [pp, lora] : runs) {
    const int m_total = 2 * pp;  // micro-batches of one row each (per dp rank)
    ModelConfig c = plan_test_config(true);
    if (pp < w) {  // FSDP in stages: more layers per stage than FSDP's 1 + prefetch depth in flight
      c.num_hidden_layers = 12;
      c.layer_types.assign(12, "full_attention");
    }
    MeshContext ctx;
    ctx.world_size = w;
    ctx.pp_size = pp;
    ctx.dp_size = w / pp;
    ctx.validate("test");
    ctx.build_mesh();
    reset_peak_memory();
    const int64_t before = memory_stats().current;
    std::shared_ptr<CausalLM> full = meta_model(c, lora);
    const MemoryPlan plan = plan_memory(*full, ctx, {1, S, m_total}, DType::f32);
    auto pp_group = ctx.mesh->group("pp");
    const int r = pp_group->rank();
    auto stages = make_pipeline_stages(*full, pp, r, 1, {}, "test");
    parallelize_pipeline_stage(*stages[0], ctx);
    PipelineExecutor ex(PipelineScheduleKind::OneFOneB, {{stages[0], r}}, pp, pp_group);
    std::vector<Tensor> params;
    for (auto& p : stages[0]->parameters())
      if (p.requires_grad()) params.push_back(p);
    optim::AdamW opt(params);
    const Tensor tied = tied_stage_weight(*stages[0]);
    std::vector<Tensor> ids, targets, not_counted;
    if (tied.defined() && !stages[0]->is_first()) not_counted.push_back(tied);
    for (int k = 0; k < m_total; ++k) {
      std::vector<int64_t> v;
      for (int64_t i = 0; i < S; ++i) v.push_back((i * 7 + k * 3 + ctx.dp_rank() * 5) % c.vocab_size);
      ids.push_back(from_vector<int64_t>(v, {1, S}));
      targets.push_back(ids.back());
    }
    // As dtr-train's PipelinedModel::step: the fused loss of each micro-batch / m.
    auto step = [&] {
      pipeline_unshard(*stages[0]);
      ex.step(ids, [&](int, const Tensor& loss) { return div(loss, static_cast<double>(m_total)); }, targets);
      pipeline_reduce_gradients(*stages[0]);
      if (tied.defined()) sum_tied_gradients(*pp_group, tied, stages[0]->is_first() ? pp - 1 : 0);
      clip_grad_norm(params, 1.0, 2.0, false, pp_group.get(), not_counted);
      opt.step();
      opt.zero_grad();
    };
    step();  // warm-up: AdamW's state
    reset_peak_memory();
    CommCounters* dp_counters = pp < w ? &ctx.fsdp_mesh().group(0)->counters() : nullptr;
    if (dp_counters) dp_counters->reset();
    step();
    // FSDP in the stages: the plan's all-gather / reduce-scatter bytes (one each per unit and
    // step) equal the dp group's counters, on the ranks of the pp rank the plan describes.
    if (dp_counters && plan.note.find("pp rank " + std::to_string(r) + "'s") != std::string::npos) {
      INFO("pp " << pp << " dp " << w / pp << " rank " << rank() << ": " << plan.note);
      CHECK(static_cast<double>(dp_counters->nbytes(CommKind::all_gather)) == plan.comm.at("dp_shard").all_gather);
      CHECK(static_cast<double>(dp_counters->nbytes(CommKind::reduce_scatter)) ==
            plan.comm.at("dp_shard").reduce_scatter);
    }
    // The plan is the pp rank with the largest peak: against the largest measured one.
    Tensor peak = from_vector<double>({static_cast<double>(memory_stats().peak - before)}, {1});
    DeviceMesh::world("plan_peak").group(0)->all_reduce(peak, ReduceOp::MAX)->wait();
    const double measured = peak.item<double>();
    if (rank() == 0)
      std::printf("[pp %d dp %d] %s: plan peak %.3f MiB (params %.3f acts %.3f) | measured peak %.3f MiB; %s\n", pp, w / pp,
                  lora ? "LoRA tied" : "full FT tied", plan.peak_bytes / 1048576, plan.param_bytes / 1048576,
                  plan.activation_bytes / 1048576, measured / 1048576, plan.note.c_str());
    INFO((lora ? "LoRA" : "full FT") << " pp " << pp << " dp " << w / pp << ": plan " << plan.peak_bytes << " measured " << measured);
    CHECK(plan.peak_bytes == Approx(measured).epsilon(0.10));
  }
}
