// parallelize_model and the recipe's distributed keys on the tiny model (its parallelizer below):
//  - defer_fsdp_grad_sync: true (default) reduce-scatters once per step, on the last micro-batch;
//    false after every micro-batch, so no unsharded gradient outlives its backward. Both give the
//    single-process losses, accumulated gradients and parameters (4 micro-batches, 5 AdamW steps;
//    1-d FSDP on 1-4 ranks, HSDP 2x2 at 4).
//  - mp_policy on a TP-only mesh (dp 1) and on one process: the units are still wrapped, so the
//    layers compute in param_dtype (bf16) with f32 master weights; the result is the f32
//    single-process run within bf16 rounding, and not the f32 run itself.
//  - offload_policy on CPU parameters: accepted, nothing moved, results unchanged.
#include "gradcheck.h"
#include "parallel/model_parallelizer.h"
#include "parallel_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

/// f32, as test_fsdp.cpp: dp and the reduction schedule change only the summation order.
constexpr double kParamTol = 1e-6;
constexpr double kLossTol = 2e-6;
constexpr int kMicro = 4;

struct TinyParallelizer : ModelParallelizer {
  ParallelizePlan tp_plan(nn::Module&, const MeshContext&) override { return tiny_tp_plan(); }
};
DTR_REGISTER_MODEL_PARALLELIZER("TinyNet", TinyParallelizer);

MeshContext make_ctx(int64_t dp_replicate, int64_t tp) {
  MeshContext c;
  c.world_size = world_size();
  c.tp_size = tp;
  c.dp_size = world_size() / tp;
  c.dp_replicate_size = dp_replicate;
  c.validate("test");
  c.build_mesh();
  return c;
}

/// Elements of unsharded gradients held by the FSDP units of `m` (leaf .grad and accumulators).
int64_t unsharded_grad_numel(nn::Module& m) {
  int64_t n = 0;
  for (auto& [fqn, sub] : m.named_modules())
    if (FSDPParamGroup* g = fsdp_param_group(*sub))
      for (const FSDPParam& p : g->params()) {
        if (p.unsharded.grad().defined()) n += p.unsharded.grad().numel();
        if (p.acc_grad.defined()) n += p.acc_grad.numel();
      }
  return n;
}

struct Run {
  RunResult r;
  std::map<std::string, Tensor> grads0;     // accumulated gradients of step 0 (full)
  std::vector<int64_t> reduce_scatters;     // per step, on the dp shard group
  std::vector<int64_t> held_after_micro0;   // unsharded gradient elements after micro-batch 0
};

Run run(MeshContext ctx, optim::Optimizer* (*make_opt)(nn::Module&), int micro) {
  auto net = make_net();
  parallelize_model(*net, ctx);
  std::unique_ptr<optim::Optimizer> opt(make_opt(*net));
  Run out;
  CommCounters& rs = ctx.fsdp_mesh().group(ctx.fsdp_mesh().ndim() - 1)->counters();
  rs.reset();
  TrainSpec s;
  s.micro = micro;
  s.dp_rank = ctx.dp_rank();
  s.dp_size = ctx.dp_size;
  s.loss_pg = DeviceMesh::world("loss").group(0);
  int calls = 0;
  s.set_sync = [&](nn::Module& m, bool last) {
    if (calls++ % micro == 1) out.held_after_micro0.push_back(unsharded_grad_numel(m));  // before micro-batch 1
    set_model_gradient_sync(m, ctx, last);
  };
  s.after_backward = [&](nn::Module& m) {
    out.reduce_scatters.push_back(rs.count(CommKind::reduce_scatter));
    rs.reset();
    if (out.grads0.empty())
      for (auto& [n, p] : m.named_parameters())
        if (p.grad().defined()) out.grads0[n] = p.grad().is_distributed() ? full_tensor(p.grad()) : p.grad().clone();
  };
  out.r.losses = train(*net, *opt, s);
  out.r.params = full_params(*net);
  return out;
}

optim::Optimizer* adamw(nn::Module& m) { return new optim::AdamW(m.parameters(), optim::AdamWOptions{1e-2}); }
optim::Optimizer* sgd(nn::Module& m) { return new optim::SGD(m.parameters(), optim::SGDOptions{0.1}); }

void check_close(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b, double tol,
                 const char* what) {
  auto [d, where] = max_param_diff(a, b);
  INFO(what << ": max |diff| " << d << " at " << where);
  CHECK(d <= tol);
}

}  // namespace

TEST_CASE("defer_fsdp_grad_sync: false reduce-scatters every micro-batch, same results as true",
          "[parallelize_model][fsdp]") {
  // Reference: one process, the whole batch per step, plain autograd.
  const RunResult ref = reference_run({}, /*sgd=*/false);
  auto ref_net = make_net();
  auto [ids, tg] = batch_rows(0, 0, kBatch);
  loss_of(*ref_net, ids, tg).backward();
  std::map<std::string, Tensor> ref_grads;
  for (auto& [n, p] : ref_net->named_parameters()) ref_grads[n] = p.grad().clone();

  std::vector<int64_t> reps{1};
  if (world_size() == 4) reps.push_back(2);
  for (int64_t rep : reps) {
    std::map<bool, Run> runs;
    for (bool defer : {true, false}) {
      INFO("dp_replicate " << rep << " defer_fsdp_grad_sync " << defer);
      MeshContext ctx = make_ctx(rep, 1);
      ctx.defer_fsdp_grad_sync = defer;
      Run r = run(ctx, adamw, kMicro);
      for (size_t i = 0; i < ref.losses.size(); ++i) {
        INFO("step " << i << ": single " << ref.losses[i] << " fsdp " << r.r.losses[i]);
        CHECK(std::abs(ref.losses[i] - r.r.losses[i]) <= kLossTol * ref.losses[i]);
      }
      check_close(ref_grads, r.grads0, kParamTol, "accumulated gradients of step 0 vs single process");
      check_close(ref.params, r.r.params, kParamTol, "parameters after 5 steps vs single process");
      // Units: 2 blocks + the root; dp 1 issues no reduce-scatter at all.
      const int64_t units = world_size() / rep > 1 ? 3 : 0;
      for (int64_t n : r.reduce_scatters) CHECK(n == (defer ? units : kMicro * units));
      if (world_size() > 1) {
        // After micro-batch 0 deferred sync holds every trainable parameter's unsharded gradient;
        // per-micro-batch sync holds none.
        int64_t all = 0;
        for (auto& [n, p] : make_net()->named_parameters()) all += p.numel();
        for (int64_t h : r.held_after_micro0) CHECK(h == (defer ? all : 0));
      }
      runs[defer] = std::move(r);
    }
    check_close(runs[true].r.params, runs[false].r.params, kParamTol, "defer true vs false");
    check_close(runs[true].grads0, runs[false].grads0, kParamTol, "step-0 gradients, defer true vs false");
  }
}

TEST_CASE("mp_policy applies on TP-only meshes (dp 1) and on one process", "[parallelize_model][mixed_precision]") {
  // SGD: parameter changes are lr x gradient, so the comparison sees the gradient error. bf16
  // (8 mantissa bits) rounds each op by up to 2^-9: the relative error of the total update over
  // 5 steps is a few 1e-3 (test_fsdp.cpp measured 3.6e-3 with dp); f32 would be ~1e-7.
  const RunResult ref = reference_run({}, /*sgd=*/true);
  MeshContext ctx = make_ctx(1, world_size());  // dp 1, tp = world (1 rank: one process)
  ctx.mp_policy.param_dtype = DType::bf16;
  ctx.mp_policy.reduce_dtype = DType::f32;
  ctx.mp_policy.output_dtype = DType::f32;
  auto net = make_net();
  auto init = full_params(*net);
  parallelize_model(*net, ctx);
  REQUIRE(is_fully_sharded(*net));
  DType head_input = DType::f64;
  net->head->register_forward_pre_hook([&](nn::Module&, const std::vector<Tensor>& in) -> std::optional<std::vector<Tensor>> {
    head_input = in[0].dtype();
    return std::nullopt;
  });
  optim::SGD opt(net->parameters(), optim::SGDOptions{0.1});
  TrainSpec s;
  s.loss_pg = DeviceMesh::world("loss").group(0);
  const auto losses = train(*net, opt, s);
  CHECK(head_input == DType::bf16);  // the layers computed in param_dtype
  for (auto& [n, p] : net->named_parameters()) CHECK(p.dtype() == DType::f32);  // f32 master weights
  for (size_t i = 0; i < losses.size(); ++i) CHECK(std::abs(losses[i] - ref.losses[i]) <= 2e-2 * ref.losses[i]);
  auto got = full_params(*net);
  double num = 0, den = 0;
  for (auto& [n, p0] : init) {
    Tensor dr = sub(ref.params.at(n).to(DType::f64), p0.to(DType::f64));
    Tensor dg = sub(got.at(n).to(DType::f64), p0.to(DType::f64));
    num += sum(mul(sub(dr, dg), sub(dr, dg))).item<double>();
    den += sum(mul(dr, dr)).item<double>();
  }
  const double rel = std::sqrt(num / den);
  INFO("relative update error vs the f32 single process " << rel);
  CHECK(rel <= 2e-2);
  CHECK(rel >= 1e-4);  // bf16 compute happened (an f32 run differs by ~1e-7)
}

TEST_CASE("offload_policy on CPU parameters: accepted, results unchanged", "[parallelize_model][fsdp]") {
  MeshContext off = make_ctx(1, 1);
  off.offload_policy.enabled = true;
  CHECK(off.str().find("host memory") != std::string::npos);
  const Run a = run(make_ctx(1, 1), adamw, 1);
  const Run b = run(off, adamw, 1);
  CHECK(a.r.losses == b.r.losses);
  check_close(a.r.params, b.r.params, 0.0, "offload vs none");
}
