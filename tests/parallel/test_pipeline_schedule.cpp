// Pipeline schedules (parallel/pipeline/schedule.h): the lists against hand-written orders and
// against each schedule's definition (GPipe all forwards first; 1F1B at most pp - rank
// micro-batches in flight and strict alternation after the warm-up; interleaved 1F1B Megatron's
// chunk order), deadlock freedom and the bubble fraction (p - 1) / (m + p - 1) on the ideal
// machine; then the executor on the world's ranks (pp = world size, a toy stage of Linear layers
// per stage) records the order it actually ran, which must be the schedule's list.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/nn/linear.h"
#include "tensor/ops.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

using K = PipelineScheduleKind;

std::string order_str(const std::vector<PipelineAction>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a.str();
  return s;
}

std::vector<std::vector<PipelineAction>> all_ranks(K kind, const PipelineShape& shape) {
  std::vector<std::vector<PipelineAction>> out;
  for (int r = 0; r < shape.pp; ++r) out.push_back(pipeline_schedule(kind, shape, r));
  return out;
}

/// The definition's invariants, checked on rank r's list.
void check_definition(K kind, const PipelineShape& s, int r, const std::vector<PipelineAction>& v) {
  INFO(pipeline_schedule_name(kind) << " pp " << s.pp << " v " << s.stages_per_rank << " m " << s.microbatches
                                    << " rank " << r << ": " << order_str(v));
  const int n = s.microbatches * s.stages_per_rank;
  REQUIRE(static_cast<int>(v.size()) == 2 * n);
  // Every (stage, micro-batch) of this rank once forward and once backward, backward after forward.
  std::set<std::pair<int, int>> f, b;
  int in_flight = 0, max_in_flight = 0;
  for (const auto& a : v) {
    CHECK(a.stage % s.pp == r);
    if (a.type == PipelineAction::Forward) {
      CHECK(f.insert({a.stage, a.microbatch}).second);
      max_in_flight = std::max(max_in_flight, ++in_flight);
    } else {
      CHECK(f.count({a.stage, a.microbatch}) == 1);
      CHECK(b.insert({a.stage, a.microbatch}).second);
      --in_flight;
    }
  }
  CHECK(static_cast<int>(f.size()) == n);
  CHECK(static_cast<int>(b.size()) == n);
  if (kind == K::GPipe) {
    for (int i = 0; i < n; ++i) CHECK(v[i].type == PipelineAction::Forward);
    CHECK(max_in_flight == s.microbatches);
  }
  if (kind == K::OneFOneB) {
    const int warm = std::min(s.pp - r - 1, s.microbatches);
    CHECK(max_in_flight == std::min(s.pp - r, s.microbatches));
    // After the warm-up: F B F B ... until the forwards run out, then only B.
    for (int i = warm; i < 2 * n - warm; ++i)
      CHECK(v[i].type == ((i - warm) % 2 == 0 ? PipelineAction::Forward : PipelineAction::Backward));
    // Micro-batches in order within each kind.
    int nf = 0, nb = 0;
    for (const auto& a : v) CHECK(a.microbatch == (a.type == PipelineAction::Forward ? nf++ : nb++));
  }
  if (kind == K::Interleaved1F1B) {
    // Forward k of this rank: micro-batch (k / (pp v)) pp + k % pp on local chunk (k / pp) % v.
    int k = 0;
    for (const auto& a : v) {
      if (a.type != PipelineAction::Forward) continue;
      CHECK(a.microbatch == (k / (s.pp * s.stages_per_rank)) * s.pp + k % s.pp);
      CHECK(a.stage == ((k / s.pp) % s.stages_per_rank) * s.pp + r);
      ++k;
    }
  }
}

/// A stage: two Linear(4, 4) with tanh between.
struct ToyStage : nn::Module {
  ToyStage() {
    register_module("a", std::make_shared<nn::Linear>(4, 4));
    register_module("b", std::make_shared<nn::Linear>(4, 4));
  }
  Tensor forward(const Tensor& x) override { return get_submodule("b")->call(tanh(get_submodule("a")->call(x))); }
};

}  // namespace

TEST_CASE("pipeline schedules: hand-written orders") {
  // GPipe, pp 2, m 3.
  CHECK(order_str(pipeline_schedule(K::GPipe, {2, 1, 3}, 0)) == "F0s0 F1s0 F2s0 B0s0 B1s0 B2s0");
  // 1F1B pp 4, m 4 (PipeDream-Flush): the last rank alternates from the start, rank 0 warms up 3.
  CHECK(order_str(pipeline_schedule(K::OneFOneB, {4, 1, 4}, 3)) == "F0s3 B0s3 F1s3 B1s3 F2s3 B2s3 F3s3 B3s3");
  CHECK(order_str(pipeline_schedule(K::OneFOneB, {4, 1, 4}, 1)) == "F0s1 F1s1 F2s1 B0s1 F3s1 B1s1 B2s1 B3s1");
  CHECK(order_str(pipeline_schedule(K::OneFOneB, {4, 1, 4}, 0)) == "F0s0 F1s0 F2s0 F3s0 B0s0 B1s0 B2s0 B3s0");
  // Interleaved pp 2, v 2, m 2: rank 1 warms up (v - 1) pp = 2 forwards (Megatron's count).
  CHECK(order_str(pipeline_schedule(K::Interleaved1F1B, {2, 2, 2}, 1)) == "F0s1 F1s1 F0s3 B0s3 F1s3 B1s3 B0s1 B1s1");
  CHECK(order_str(pipeline_schedule(K::Interleaved1F1B, {2, 2, 2}, 0)) == "F0s0 F1s0 F0s2 F1s2 B0s2 B1s2 B0s0 B1s0");
}

TEST_CASE("pipeline schedules: definitions, deadlock freedom and the bubble") {
  for (int pp : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      for (K kind : {K::GPipe, K::OneFOneB}) {
        const PipelineShape s{pp, 1, m};
        auto lists = all_ranks(kind, s);
        for (int r = 0; r < pp; ++r) check_definition(kind, s, r, lists[r]);
        // On the ideal machine both give the textbook bubble (p - 1) / (m + p - 1).
        const double bubble = simulate_pipeline_bubble(lists, s);
        INFO(pipeline_schedule_name(kind) << " pp " << pp << " m " << m);
        CHECK(std::abs(bubble - double(pp - 1) / (m + pp - 1)) < 1e-12);
      }
      if (m % pp != 0) continue;
      for (int v : {1, 2, 3}) {
        const PipelineShape s{pp, v, m};
        auto lists = all_ranks(K::Interleaved1F1B, s);
        for (int r = 0; r < pp; ++r) check_definition(K::Interleaved1F1B, s, r, lists[r]);
        const double bubble = simulate_pipeline_bubble(lists, s);  // throws on a deadlock
        INFO("interleaved pp " << pp << " v " << v << " m " << m << " bubble " << bubble);
        // Megatron (Narayanan et al. 2021): the bubble shrinks by v, (p - 1) / (v m + p - 1).
        CHECK(std::abs(bubble - double(pp - 1) / (v * m + pp - 1)) < 1e-12);
      }
    }
}

TEST_CASE("pipeline schedules: bad input") {
  CHECK_THROWS_WITH(parse_pipeline_schedule("zb", "distributed.pipeline.pp_schedule"),
                    Catch::Contains("distributed.pipeline.pp_schedule") && Catch::Contains("gpipe, 1f1b"));
  CHECK(parse_pipeline_schedule("Interleaved1F1B", "x") == K::Interleaved1F1B);
  CHECK(parse_pipeline_schedule("GPipe", "x") == K::GPipe);
  CHECK_THROWS_WITH(pipeline_schedule(K::Interleaved1F1B, {2, 2, 3}, 0), Catch::Contains("multiple of pp_size"));
  CHECK_THROWS_WITH(pipeline_schedule(K::OneFOneB, {2, 2, 4}, 0), Catch::Contains("one stage per rank"));
  // A list that waits for a forward nobody runs.
  std::vector<std::vector<PipelineAction>> bad = {{{PipelineAction::Backward, 0, 0}, {PipelineAction::Forward, 0, 0}},
                                                  {{PipelineAction::Forward, 1, 0}, {PipelineAction::Backward, 1, 0}}};
  CHECK_THROWS_WITH(simulate_pipeline_bubble(bad, {2, 1, 1}), Catch::Contains("deadlocks"));
}

TEST_CASE("pipeline executor: the order each rank ran is the schedule's") {
  const int pp = world_size(), r = rank();
  DeviceMesh mesh = DeviceMesh::world("pp");
  for (K kind : {K::GPipe, K::OneFOneB, K::Interleaved1F1B}) {
    const int v = kind == K::Interleaved1F1B ? 2 : 1;
    const int m = 2 * pp;
    manual_seed(7);
    std::vector<PipelineStage> stages;
    for (int s = r; s < pp * v; s += pp) stages.push_back({std::make_shared<ToyStage>(), s});
    PipelineExecutor ex(kind, stages, pp * v, mesh.group(0));
    std::vector<Tensor> in;
    for (int i = 0; i < m; ++i) in.push_back(full({2, 4}, 0.1 * (i + 1)));
    auto losses = ex.step(in, [](int, const Tensor& y) { return sum(mul(y, y)); });
    INFO(pipeline_schedule_name(kind) << " rank " << r);
    CHECK(order_str(ex.stats().order) == order_str(pipeline_schedule(kind, {pp, v, m}, r)));
    CHECK(losses.size() == (r == pp - 1 ? static_cast<size_t>(m) : 0u));
    for (auto& st : stages)
      for (auto& p : st.module->parameters()) CHECK(p.grad().defined());
  }
}
