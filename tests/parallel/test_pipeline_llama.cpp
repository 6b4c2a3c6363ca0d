// Pipeline parallelism on an 8-layer debug Llama: the stages of each pp rank (CausalLMStage)
// run GPipe, 1F1B and interleaved 1F1B (2 stages per rank) over the micro-batches of each step,
// alone (pp = world: 2, 3, 4 ranks; 3 gives uneven 3/3/2 and 2/2/1/1/1/1 splits) and at 4 ranks
// as pp 2 x dp 2 (FSDP per stage, with activation checkpointing) and pp 2 x tp 2 (TP inside the
// stages, loss parallel on the last); full fine-tune and LoRA; a recipe layer list (1 + 7);
// tied embeddings (gradients summed between the first and last stage); the last stage takes the
// loss through the fused head (targets), once from its logits. Every run's step-0 loss
// and gradients, and the losses and parameters after 5 AdamW steps, equal the single process
// (whole model, the same micro-batches accumulated in one loop); no frozen parameter holds a
// .grad after a step and the live bytes after every step equal those after the first.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "dtensor/api.h"
#include "llama_test_util.h"
#include "models/lora/inject.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/pipeline_stage.h"
#include "parallel/clip_grad.h"
#include "parallel/mesh_context.h"
#include "parallel/model_parallelizer.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/parallelize_stage.h"
#include "parallel/pipeline/stage_fsdp.h"
#include "parallel/pipeline/tied_weights.h"
#include "runtime/env.h"
#include "tensor/allocator.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

using K = PipelineScheduleKind;
constexpr int64_t kSeq = 8, kRowsPerMicro = 2;
/// f32: only summation orders differ (micro-batch accumulation is the same loop; dp sums and TP
/// partial products differ in the last bits). As in test_fsdp_llama: AdamW's 1/sqrt(v) amplifies
/// that noise on elements with near-zero gradients; 1e-4 is 10% of one lr-1e-3 step, so a wrong
/// gradient (whole steps) cannot pass (the fused head's per-micro-batch chunks against the single
/// process's one chunk gave 4.5e-5 after 5 steps on pp 3, with step-0 gradients equal to 1e-6).
/// Gradients: relative to the largest element of the tensor.
constexpr double kParamTol = 1e-4, kLossTol = 1e-6, kGradTol = 1e-5;

ModelConfig config(bool tied) {
  ModelConfig c = llama_debug_config();
  c.num_hidden_layers = 8;
  c.layer_types.assign(8, "full_attention");
  c.tie_word_embeddings = tied;
  return c;
}

std::shared_ptr<CausalLM> make_model(bool lora, bool tied) { return testing::make_debug_llama(lora, config(tied)); }

struct Run {
  std::vector<double> losses;
  double eval0 = 0;  // forward-only loss before the first step
  double norm0 = 0;  // global gradient norm of step 0
  std::map<std::string, Tensor> grads0;  // gradients after step 0's backward (full tensors)
  std::map<std::string, Tensor> params;  // parameters after the last step (full tensors)
  std::vector<int64_t> live;  // pipeline runs: allocator live bytes after each step (zero_grad included)
  std::vector<std::string> frozen_with_grad;  // pipeline runs: frozen parameters holding a .grad
};

Tensor full_of(const Tensor& t) { return t.is_distributed() ? full_tensor(t.detach()) : t.detach().clone(); }

/// Micro-batch k of data-parallel rank d at `step`: rows [(d m + k) r, (d m + k + 1) r).
Tensor micro_rows(int step, int64_t d, int m, int k) {
  const int64_t b0 = (d * m + k) * kRowsPerMicro;
  return testing::debug_token_rows(step, b0, b0 + kRowsPerMicro, kSeq);
}

/// The single process: the whole model on the whole batch (the micro_total micro-batches' rows
/// in one forward; equal token counts, so its token mean is the mean of the micro-batch means).
/// `fused`: the loss through the model's fused head (causal_lm_loss(model, ids, labels), as
/// dtr-train takes it), else from its logits. Cached per (lora, tied, micro_total, fused).
const Run& reference(bool lora, bool tied, int micro_total, bool fused) {
  static std::map<std::tuple<bool, bool, int, bool>, Run> cache;
  auto it = cache.find({lora, tied, micro_total, fused});
  if (it != cache.end()) return it->second;
  auto model = make_model(lora, tied);
  std::vector<Tensor> ps;
  for (auto& p : model->parameters())
    if (p.requires_grad()) ps.push_back(p);
  optim::AdamW adam(ps, optim::AdamWOptions{1e-3});
  Run r;
  for (int step = 0; step < 5; ++step) {
    Tensor ids = testing::debug_token_rows(step, 0, micro_total * kRowsPerMicro, kSeq);
    Tensor loss = fused ? causal_lm_loss(*model, ids, ids) : causal_lm_loss(model->call(ids), ids);
    loss.backward();
    if (step == 0) r.norm0 = clip_grad_norm(ps, std::numeric_limits<double>::infinity());
    if (step == 0)  // every name (a tied table under both: the stages hold one each)
      for (auto& [n, p] : model->named_parameters("", true, false))
        if (p.requires_grad()) r.grads0[n] = p.grad().clone();
    adam.step();
    adam.zero_grad();
    r.losses.push_back(loss.item<double>());
  }
  for (auto& [n, p] : model->named_parameters("", true, false)) r.params[n] = p.detach().clone();
  return cache[{lora, tied, micro_total, fused}] = std::move(r);
}

struct Setup {
  int pp = 1, dp = 1, tp = 1;
  K kind = K::OneFOneB;
  bool lora = false, tied = false, ac = false, sp = false;
  bool fused = true;  // the last stage takes the loss through the fused head (targets); else logits
  int dp_replicate = 1;
  std::vector<int64_t> layer_counts;  // recipe list (empty: balanced)
};

/// HF's shifted targets of `ids` [B, T]: ids[:, 1:] and -100 at the last position.
Tensor shifted_targets(const Tensor& ids) {
  const int64_t B = ids.size(0), T = ids.size(1);
  return cat({slice(ids, 1, 1, T), full({B, 1}, -100.0, TensorOptions(DType::i64))}, 1);
}

/// The pipeline run: this rank's stages parallelized on its (dp, tp) slice, m = 2 pp micro-batches
/// per dp rank and step.
Run pipelined(const Setup& s, int m) {
  MeshContext ctx;
  ctx.world_size = world_size();
  ctx.pp_size = s.pp;
  ctx.dp_size = s.dp;
  ctx.dp_replicate_size = s.dp_replicate;
  ctx.tp_size = s.tp;
  ctx.sequence_parallel = s.sp;
  if (s.ac) ctx.activation_checkpointing = CheckpointPolicy::full;
  ctx.build_mesh();
  const int pp_rank = static_cast<int>(ctx.mesh->coordinate(0));
  auto pp_group = ctx.mesh->group("pp");
  const int v = s.kind == K::Interleaved1F1B ? 2 : 1;
  auto full_model = make_model(s.lora, s.tied);
  auto stages = make_pipeline_stages(*full_model, s.pp, pp_rank, v, s.layer_counts, "test");
  full_model.reset();
  std::vector<PipelineStage> ps;
  std::vector<Tensor> trainable;
  for (auto& st : stages) {
    parallelize_pipeline_stage(*st, ctx);
    ps.push_back({st, static_cast<int>(&st - &stages[0]) * s.pp + pp_rank});
    for (auto& p : st->parameters())  // once each (pp 1: a tied table is in two stages)
      if (p.requires_grad() && std::none_of(trainable.begin(), trainable.end(),
                                            [&](const Tensor& t) { return t.impl() == p.impl(); }))
        trainable.push_back(p);
  }
  PipelineExecutor ex(s.kind, ps, s.pp * v, pp_group);
  optim::AdamW adam(trainable, optim::AdamWOptions{1e-3});
  const int64_t dp_rank = ctx.dp_rank();
  const bool has_last = stages.back()->is_last();
  // The tied copy of this rank (first stage: embedding, last: lm_head) and its peer.
  Tensor tied_w;
  for (auto& st : stages)
    if (!tied_w.defined() && (st->is_first() || st->is_last())) tied_w = tied_stage_weight(*st);
  const int tied_peer = stages.front()->is_first() ? s.pp - 1 : 0;
  // The last stage's copy of the tied table is left out of the norm (its gradient is the first's).
  std::vector<Tensor> not_counted;
  if (tied_w.defined() && !stages.front()->is_first()) not_counted.push_back(tied_w);
  auto world_pg = DeviceMesh::world("loss").group(0);
  // Sum over the world of this rank's value / `share` (the last stage's loss on every (dp, tp) rank).
  auto world_sum = [&](double v) {
    Tensor t = from_vector<double>({v}, {1});
    world_pg->all_reduce(t)->wait();
    return t.item<double>();
  };
  // Micro-batch k's share of the step's token mean: its own mean / m, from the last stage's
  // fused loss (given the shifted targets) or from its logits.
  auto targets_of = [&](const std::vector<Tensor>& ids) {
    std::vector<Tensor> t;
    if (s.fused)
      for (const auto& x : ids) t.push_back(shifted_targets(x));
    return t;
  };
  auto loss_of = [&](const std::vector<Tensor>& ids) {
    return [&, ids](int k, const Tensor& out) {
      return div(s.fused ? out : causal_lm_loss(out, ids[k]), static_cast<double>(m));
    };
  };
  Run r;
  {
    std::vector<Tensor> ids;
    for (int k = 0; k < m; ++k) ids.push_back(micro_rows(0, dp_rank, m, k));
    for (auto& st : stages) pipeline_unshard(*st);
    auto losses = ex.forward_only(ids, loss_of(ids), targets_of(ids));
    for (auto& st : stages) pipeline_reshard(*st);
    double ls = 0;
    for (auto& l : losses) ls += full_of(l).item<double>();
    r.eval0 = world_sum(has_last ? ls / (s.tp * s.dp) : 0.0);
  }
  for (int step = 0; step < 5; ++step) {
    std::vector<Tensor> ids;
    for (int k = 0; k < m; ++k) ids.push_back(micro_rows(step, dp_rank, m, k));
    for (auto& st : stages) pipeline_unshard(*st);
    // Each dp rank's token mean over its m micro-batches; FSDP averages the gradients over dp.
    auto losses = ex.step(ids, loss_of(ids), targets_of(ids));
    for (auto& st : stages) pipeline_reduce_gradients(*st);
    if (tied_w.defined()) sum_tied_gradients(*pp_group, tied_w, tied_peer);
    if (step == 0)
      r.norm0 = clip_grad_norm(trainable, std::numeric_limits<double>::infinity(), 2.0, false, pp_group.get(),
                               not_counted);
    if (step == 0)
      for (auto& st : stages)
        for (auto& [n, p] : st->named_parameters())
          if (p.requires_grad()) r.grads0[n] = full_of(p.grad());
    adam.step();
    adam.zero_grad();
    for (auto& st : stages)
      for (auto& [n, p] : st->named_parameters())
        if (!p.requires_grad() && p.grad().defined()) r.frozen_with_grad.push_back(n);
    double ls = 0;
    for (auto& l : losses) ls += full_of(l).item<double>();
    r.live.push_back(memory_stats().current);
    // Every (dp, tp) rank of the last stage holds its dp rank's mean; tp ranks hold equal values.
    r.losses.push_back(world_sum(has_last ? ls / (s.tp * s.dp) : 0.0));
  }
  for (auto& st : stages)
    for (auto& [n, p] : st->named_parameters()) r.params[n] = full_of(p);
  return r;
}

void check_same(const Run& ref, const Run& got, const std::string& what) {
  INFO(what << " rank " << rank());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i << " single " << ref.losses[i] << " pipeline " << got.losses[i]);
    CHECK(std::abs(ref.losses[i] - got.losses[i]) <= kLossTol * ref.losses[i]);
  }
  CHECK(std::abs(ref.losses[0] - got.eval0) <= kLossTol * ref.losses[0]);
  CHECK(std::abs(ref.norm0 - got.norm0) <= kLossTol * ref.norm0);
  REQUIRE(!got.params.empty());
  double worst_g = 0, worst_p = 0;
  std::string at_g, at_p;
  for (auto& [n, g] : got.grads0) {
    REQUIRE(ref.grads0.count(n));
    const Tensor& e = ref.grads0.at(n);
    REQUIRE(e.sizes() == g.sizes());
    const double scale = std::max(amax(abs(e)).item<double>(), 1e-12);
    const double d = amax(abs(sub(e, g))).item<double>() / scale;
    if (d > worst_g) worst_g = d, at_g = n;
  }
  for (auto& [n, p] : got.params) {
    REQUIRE(ref.params.count(n));
    REQUIRE(ref.params.at(n).sizes() == p.sizes());
    const double d = amax(abs(sub(ref.params.at(n), p))).item<double>();
    if (d > worst_p) worst_p = d, at_p = n;
  }
  INFO("max rel |grad diff| " << worst_g << " at " << at_g << "; max |param diff| " << worst_p << " at " << at_p);
  CHECK(worst_g <= kGradTol);
  CHECK(worst_p <= kParamTol);
}

std::string name(const Setup& s) {
  return std::string(pipeline_schedule_name(s.kind)) + " pp " + std::to_string(s.pp) + " dp " + std::to_string(s.dp) +
         " tp " + std::to_string(s.tp) + (s.fused ? "" : " logits") + (s.dp_replicate > 1 ? " hsdp" : "") + (s.sp ? " sp" : "") + (s.lora ? " lora" : "") + (s.tied ? " tied" : "") + (s.ac ? " ac" : "");
}

/// Nothing outlives a step: a frozen parameter never gets a .grad (a tied frozen table would
/// hold [vocab, hidden] from the first step on), and the live bytes after every step equal
/// those after the first (which created the gradients and AdamW's state).
void check_no_retention(const Run& got, const std::string& what) {
  INFO(what << " rank " << rank());
  for (const auto& n : got.frozen_with_grad) FAIL_CHECK("frozen " << n << " holds a .grad after a step");
  for (size_t i = 1; i < got.live.size(); ++i) {
    INFO("live bytes after step " << i << " " << got.live[i] << " vs after step 0 " << got.live[0]);
    CHECK(got.live[i] == got.live[0]);
  }
}

void run_and_compare(const Setup& s) {
  const int m = 2 * s.pp;
  const Run got = pipelined(s, m);
  check_same(reference(s.lora, s.tied, m * s.dp, s.fused), got, name(s));
  check_no_retention(got, name(s));
}

}  // namespace

TEST_CASE("pipeline: pp alone (pp = world size) equals the single process, every schedule") {
  for (K kind : {K::GPipe, K::OneFOneB, K::Interleaved1F1B}) {
    Setup s;
    s.pp = world_size();
    s.kind = kind;
    run_and_compare(s);
  }
  Setup logits;  // the last stage returns logits, the loss is taken from them
  logits.pp = world_size();
  logits.fused = false;
  run_and_compare(logits);
  Setup lora;  // LoRA: frozen base, adapters in every stage
  lora.pp = world_size();
  lora.lora = true;
  run_and_compare(lora);
}

TEST_CASE("pipeline: a recipe layer list and tied embeddings") {
  const int W = world_size();
  if (W == 2) {
    Setup s;
    s.pp = 2;
    s.layer_counts = {1, 7};
    run_and_compare(s);
  }
  for (K kind : {K::OneFOneB, K::Interleaved1F1B}) {
    Setup s;
    s.pp = W;
    s.kind = kind;
    s.tied = true;
    run_and_compare(s);
  }
  Setup frozen;  // LoRA with tied embeddings: the frozen table's two copies need no exchange
  frozen.pp = W;
  frozen.lora = true;
  frozen.tied = true;
  run_and_compare(frozen);
}

TEST_CASE("pipeline: pp 2 x dp 2 (FSDP per stage) and pp 2 x tp 2 (TP in the stages)") {
  if (world_size() != 4) return;
  for (K kind : {K::GPipe, K::OneFOneB, K::Interleaved1F1B}) {
    Setup dp;
    dp.pp = 2, dp.dp = 2, dp.kind = kind, dp.ac = kind == K::OneFOneB;
    run_and_compare(dp);
    Setup tp;
    tp.pp = 2, tp.tp = 2, tp.kind = kind;
    run_and_compare(tp);
  }
  Setup dp_lora;
  dp_lora.pp = 2, dp_lora.dp = 2, dp_lora.lora = true, dp_lora.kind = K::Interleaved1F1B;
  run_and_compare(dp_lora);
  Setup tp_lora;  // LoRA and sequence parallelism in the stages
  tp_lora.pp = 2, tp_lora.tp = 2, tp_lora.lora = true, tp_lora.sp = true;
  run_and_compare(tp_lora);
  Setup tied;
  tied.pp = 2, tied.dp = 2, tied.tied = true;
  run_and_compare(tied);
}

// Not registered with ctest (the suite runs 1-4 ranks): mpirun -np 8 parallel_test_pipeline_llama.
TEST_CASE("pipeline: 8 ranks: pp 2 x HSDP (2 x 2), pp 2 x dp 2 x tp 2 (FSDP + TP + SP in the stages)") {
  if (world_size() != 8) return;
  for (K kind : {K::OneFOneB, K::Interleaved1F1B}) {
    Setup hsdp;
    hsdp.pp = 2, hsdp.dp = 4, hsdp.dp_replicate = 2, hsdp.kind = kind;
    run_and_compare(hsdp);
    Setup three_d;
    three_d.pp = 2, three_d.dp = 2, three_d.tp = 2, three_d.kind = kind, three_d.sp = kind == K::OneFOneB;
    three_d.lora = kind == K::Interleaved1F1B;
    run_and_compare(three_d);
  }
}

TEST_CASE("pipeline: what is not built under pp is a one-line error") {
  MeshContext ctx;
  ctx.world_size = world_size();
  ctx.pp_size = world_size();
  ctx.build_mesh();
  auto m = make_model(false, false);
  auto stages = make_pipeline_stages(*m, ctx.pp_size, static_cast<int>(ctx.mesh->coordinate(0)), 1, {}, "test");
  ctx.mp_policy.param_dtype = DType::bf16;
  CHECK_THROWS_WITH(parallelize_pipeline_stage(*stages[0], ctx),
                    Catch::Contains("mixed precision inside pipeline stages is not built"));
  CHECK_THROWS_WITH(make_pipeline_stages(*m, 3, 0, 3, {}, "distributed.pipeline"),
                    Catch::Contains("8 layers cannot fill 9 pipeline stages"));
  CHECK_THROWS_WITH(make_pipeline_stages(*m, 2, 0, 1, {4, 3}, "distributed.pipeline"),
                    Catch::Contains("sum to 7, the model has 8 layers"));
  Tensor ids = testing::debug_token_rows(0, 0, 2, kSeq);
  auto first = make_pipeline_stages(*m, 2, 0, 1, {}, "test");
  CHECK_THROWS_WITH(first[0]->forward_list({ids, ids}), Catch::Contains("targets go to the last stage only"));
  auto last = make_pipeline_stages(*m, 2, 1, 1, {}, "test");
  Tensor h = zeros({2, kSeq, m->config().hidden_size});
  CHECK_THROWS_WITH(last[0]->forward_list({h, zeros({3, kSeq}, DType::i64)}),
                    Catch::Contains("targets must be [B, T] with the input's B"));
}
