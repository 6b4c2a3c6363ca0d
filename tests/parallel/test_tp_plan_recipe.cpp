// distributed.tp_plan (a recipe's module-name pattern -> style name map) on a model that has no
// parallelizer sidecar: TP 2 on 2 ranks and FSDP + TP (dp 2 x tp 2) on 4 give the single-process
// losses and parameters over 5 AdamW steps; without a plan such a model is a one-line error, and
// so is a pattern that matches no module. (1 and 3 ranks: the style names and errors only.)
#include "gradcheck.h"
#include "parallel/model_parallelizer.h"
#include "parallel/tensor_parallel/plan_from_names.h"
#include "parallel_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

/// f32, as test_model_parallelizer.cpp: TP and dp change only the summation order.
constexpr double kParamTol = 1e-6;
constexpr double kLossTol = 2e-6;

/// The tiny model under a type name no parallelizer is registered for.
struct BareNet : TinyNet {
  std::string type_name() const override { return "BareNet"; }
};

std::shared_ptr<BareNet> make_bare() {
  manual_seed(1234);  // make_net's seed: the reference run starts from the same weights
  return std::make_shared<BareNet>();
}

/// tp_size `tp`, dp the rest, and the recipe's plan entries (apps/train/distributed_config.h
/// reads them; test_distributed_config checks the parsing).
MeshContext tp_ctx(int64_t tp, std::vector<std::pair<std::string, std::string>> plan = {}) {
  MeshContext c;
  c.world_size = world_size();
  c.tp_size = tp;
  c.tp_plan = std::move(plan);
  c.infer_dp_size("test");
  c.validate("test");
  c.build_mesh();
  return c;
}

}  // namespace

TEST_CASE("plan_from_names: Automodel's style names", "[tp_plan]") {
  // The styles: Automodel's translation, and its loss-parallel lm_head.
  ParallelizePlan p = plan_from_names({{"a", "rowwise_rep"}, {"lm_head", "colwise_rep"}, {"b", "colwise_rep"}}, "w");
  CHECK(p[0].second->type_name() == "RowwiseParallel");
  CHECK(p[0].second->input_layout->is_replicate());
  CHECK(p[1].second->output_layout->is_shard());
  CHECK_FALSE(p[1].second->use_local_output);
  CHECK(p[2].second->output_layout->is_replicate());
  CHECK(p[2].second->use_local_output);
}

TEST_CASE("distributed.tp_plan: TP for a model without a sidecar equals the single process", "[tp_plan][fsdp]") {
  const int w = world_size();
  auto bare = make_bare();
  if (w > 1) {
    MeshContext tp_no_plan = tp_ctx(w);
    CHECK_THROWS_WITH(parallelize_model(*bare, tp_no_plan),
                      Catch::Contains("no tensor-parallel plan for model type BareNet") &&
                          Catch::Contains("distributed.tp_plan"));
    MeshContext bad = tp_ctx(w, {{"layers.*.fc3", "colwise"}});
    CHECK_THROWS_WITH(parallelize_model(*make_bare(), bad),
                      Catch::Contains("distributed.tp_plan: pattern 'layers.*.fc3' matches no module of BareNet") &&
                          Catch::Contains("layers.0.fc1"));
  }
  if (w % 2 != 0) return;
  const RunResult ref = reference_run({}, /*sgd=*/false);
  MeshContext ctx = tp_ctx(2, {{"emb", "embedding_rowwise"},
                                 {"layers.*.fc1", "colwise"},
                                 {"layers.*.fc2", "rowwise"},
                                 {"head", "colwise_rep"}});
  INFO("dp " << ctx.dp_size << " x tp 2");
  auto net = make_bare();
  parallelize_model(*net, ctx);
  CHECK(net->emb->parameter("weight").is_distributed());
  optim::AdamW opt(net->parameters(), optim::AdamWOptions{1e-2});
  TrainSpec s;
  s.dp_rank = ctx.dp_rank();
  s.dp_size = ctx.dp_size;
  s.loss_pg = ctx.dp_mesh().group(0);
  const auto losses = train(*net, opt, s);
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i << ": single " << ref.losses[i] << " tp_plan " << losses[i]);
    CHECK(std::abs(ref.losses[i] - losses[i]) <= kLossTol * ref.losses[i]);
  }
  auto [d, where] = max_param_diff(ref.params, full_params(*net));
  INFO("parameters after 5 steps: max |diff| " << d << " at " << where);
  CHECK(d <= kParamTol);
}
