// Recipe parsing, --set overrides and the one-line errors of bad recipes (no MPI needed:
// make_plan only validates against a given world size).
#include <catch2/catch.hpp>

#include <limits>
#include <string>

#include "apps/train/recipe.h"
#include "apps/train/setup.h"
#include "tensor/error.h"

using namespace dtr;
using namespace dtr::train;

namespace {

const char* kSingle = "configs/ci/single.yaml";

/// The message of the dtr::Error that `f` throws ("" when nothing is thrown).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string plan_error(const std::vector<std::string>& sets, int world) {
  return error_of([&] { make_plan(load_recipe(kSingle, sets), world); });
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("recipe: the CI recipe parses with its values and defaults") {
  Recipe r = load_recipe(kSingle, {});
  CHECK(r.model.random());
  CHECK(r.model.config["num_attention_heads"].as<int>() == 6);
  CHECK(r.peft.enabled);
  CHECK(r.peft.target_modules == std::vector<std::string>{"*_proj"});
  CHECK(r.peft.dim == 4);
  CHECK(r.dataset.type == "text");
  CHECK(r.dataset.paths == std::vector<std::string>{"tests/apps/data/ci_corpus.txt"});
  CHECK(r.step_scheduler.global_batch_size == 8);
  CHECK(r.optimizer.lr == Approx(5e-3));
  CHECK(r.optimizer.beta2 == Approx(0.999));
  CHECK(r.lr_scheduler.lr_decay_style == "cosine");
  CHECK(r.logging.metrics_file == "out/ci/single/metrics.jsonl");
  CHECK(r.checkpoint.adapter_dir == "out/ci/single/adapter");
  CHECK(r.seed == 1234);
  // dump -> parse round trip keeps the values
  Recipe r2 = parse_recipe(YAML::Load(dump_recipe(r)), "dump");
  CHECK(r2.step_scheduler.max_steps == r.step_scheduler.max_steps);
  CHECK(r2.peft.alpha == r.peft.alpha);
}

TEST_CASE("recipe: --set overrides are typed and create maps") {
  Recipe r = load_recipe(kSingle, {"optimizer.lr=0.25", "step_scheduler.max_steps=3", "peft.target_modules=[q_proj, v_proj]",
                                   "distributed.tp_size=2", "checkpoint.enabled=false"});
  CHECK(r.optimizer.lr == 0.25);
  CHECK(r.step_scheduler.max_steps == 3);
  CHECK(r.peft.target_modules == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(r.distributed["tp_size"].as<int>() == 2);
  CHECK_FALSE(r.checkpoint.enabled);
  CHECK(r.source_of("optimizer.lr") == "--set optimizer.lr");
  CHECK(r.source_of("optimizer.eps") == kSingle);
  // A map changed by --set of its keys names the file and each of them, not the first --set alone.
  CHECK(r.source_of("optimizer") == std::string(kSingle) + ", --set optimizer.lr");
  Recipe two = load_recipe(kSingle, {"distributed.dp_size=1", "distributed.tp_size=1", "optimizer.lr=0.5", "optimizer={lr: 0.25}"});
  CHECK(two.source_of("distributed.tp_size") == "--set distributed.tp_size");
  CHECK(two.source_of("distributed") == std::string(kSingle) + ", --set distributed.dp_size, --set distributed.tp_size");
  CHECK(two.source_of("optimizer") == "--set optimizer");  // the last --set replaced the whole map
  CHECK(two.source_of("optimizer.lr") == "--set optimizer");
  YAML::Node n;
  apply_override(n, "a.b.c=7");
  CHECK(n["a"]["b"]["c"].as<int>() == 7);
  CHECK(contains(error_of([&] { apply_override(n, "novalue"); }), "expected key.path=value"));
}

TEST_CASE("recipe: parse errors name the key, the value and the source") {
  auto err = [](const std::vector<std::string>& sets) { return error_of([&] { load_recipe(kSingle, sets); }); };
  std::string e = err({"optimizer.lrr=1"});
  CHECK(contains(e, "unknown key optimizer.lrr"));
  CHECK(contains(e, "--set optimizer.lrr"));
  e = err({"bogus.x=1"});
  CHECK(contains(e, "unknown section 'bogus'"));
  e = err({"step_scheduler.max_steps=ten"});
  CHECK(contains(e, "step_scheduler.max_steps: expected an integer, got 'ten'"));
  e = err({"optimizer.lr=-0.1"});
  CHECK(contains(e, "optimizer.lr must be >= 0, got -0.1"));
  e = err({"optimizer.betas=[0.9]"});
  CHECK(contains(e, "optimizer.betas: expected a list of two numbers"));
  e = err({"peft.dropout=true"});
  CHECK(contains(e, "peft.dropout: expected a number"));
  e = err({"checkpoint.enabled=maybe"});
  CHECK(contains(e, "checkpoint.enabled: expected true or false"));
  e = err({"lr_scheduler.lr_decay_style=exp"});
  CHECK(contains(e, "lr_scheduler.lr_decay_style must be cosine, linear or constant"));
  e = err({"step_scheduler.global_batch_size=9"});
  CHECK(contains(e, "step_scheduler.global_batch_size=9 is not a multiple of step_scheduler.local_batch_size=2"));
  e = err({"dataset.type=parquet"});
  CHECK(contains(e, "dataset.type must be chat_jsonl, text, token_shards, squad or column_mapped"));
  CHECK(contains(error_of([] { load_recipe("configs/ci/none.yaml", {}); }), "cannot read recipe file"));
  // Every message is one line.
  for (const auto& s : {err({"optimizer.lrr=1"}), err({"step_scheduler.max_steps=[1, 2]"})})
    CHECK(s.find('\n') == std::string::npos);
}

TEST_CASE("recipe: checks against the world size and the model, before any allocation") {
  std::string e = plan_error({"distributed.tp_size=4"}, 4);
  CHECK(contains(e, "distributed.tp_size=4 does not divide num_attention_heads=6"));
  e = plan_error({"distributed.dp_size=2", "distributed.tp_size=2"}, 3);
  CHECK(contains(e, "distributed"));
  CHECK(contains(e, "3"));  // the world size is named
  e = plan_error({"distributed.dp_size=4", "step_scheduler.global_batch_size=12"}, 4);
  CHECK(contains(e, "step_scheduler.global_batch_size=12 is not divisible by step_scheduler.local_batch_size=2 x "
                    "dp_size=4 (= 8)"));
  e = error_of([] {
    Recipe r = load_recipe(kSingle, {});
    r.model.path = "data/does-not-exist.gguf";
    make_plan(r, 1);
  });
  CHECK(contains(e, "model.path: no such file or directory 'data/does-not-exist.gguf'"));
  e = plan_error({"peft.target_modules=[nothing_here]"}, 1);
  CHECK(contains(e, "peft.target_modules [nothing_here] match no Linear module"));
  e = plan_error({"distributed.bogus=1"}, 1);
  CHECK(contains(e, "bogus"));
  // A bad value in the second --set of a section is named by its own key, not by the first --set.
  e = plan_error({"distributed.dp_size=1", "distributed.tp_size=abc"}, 1);
  CHECK(e.rfind("--set distributed.tp_size: distributed.tp_size: expected an integer, got 'abc'", 0) == 0);
  e = plan_error({"distributed.dp_size=1", "distributed.sequence_parallel=maybe"}, 1);
  CHECK(e.rfind("--set distributed.sequence_parallel: distributed.sequence_parallel: expected true or false", 0) == 0);
  // A mesh check involves several keys: the file and every --set that changed the section.
  e = plan_error({"distributed.dp_size=1", "distributed.tp_size=3"}, 1);
  CHECK(e.rfind(std::string(kSingle) + ", --set distributed.dp_size, --set distributed.tp_size: distributed", 0) == 0);
  // ep carved out of dp: 3 does not divide dp 4; 2 does, but the dense model has no experts
  e = plan_error({"distributed.ep_size=3"}, 4);
  CHECK(contains(e, "ep_size=3 does not divide dp_shard_cp"));
  e = plan_error({"distributed.ep_size=2"}, 4);
  CHECK(contains(e, "distributed.ep_size=2"));
  CHECK(contains(e, "has no MoE block"));
}

TEST_CASE("recipe: MoE parameter count holds every expert") {
  // configs/ci/moe.yaml: 2 Qwen3-MoE layers, hidden 32, 4 heads / 2 kv of 8, 6 experts of 16,
  // vocab 256 untied: attention q, o 32 x 32 + k, v 32 x 16, norms 2 x 32 + q/k norms 2 x 8,
  // router 6 x 32 + experts 6 x 3 x 32 x 16. 41536 is also what dtr-train's model holds (its
  // "model ready" line). Before MoE layers were counted, each was a dense 3 x 32 x 64 MLP.
  Plan p = make_plan(load_recipe("configs/ci/moe.yaml", {}), 1);
  const int64_t layer = 2 * 32 * 32 + 2 * 32 * 16 + 2 * 32 + 2 * 8 + 6 * 32 + 6 * 3 * 32 * 16;
  CHECK(p.total_params == 256 * 32 * 2 + 32 + 2 * layer);
  CHECK(p.total_params == 41536);
  CHECK(p.trainable_params == p.total_params);
  // the aux loss under activation checkpointing: found before allocating (a rank error mid-step before)
  const std::string e = error_of([] {
    make_plan(load_recipe("configs/ci/moe.yaml", {"distributed.activation_checkpointing=true"}), 1);
  });
  CHECK(e.find("load-balancing loss under activation checkpointing is not built") != std::string::npos);
  CHECK(error_of([] {
          make_plan(load_recipe("configs/ci/moe.yaml", {"distributed.activation_checkpointing=true",
                                                        "model.config.router_aux_loss_coef=0"}), 1);
        }).empty());
}

TEST_CASE("recipe: plan derives accumulation and parameter counts") {
  Plan p = make_plan(load_recipe(kSingle, {}), 1);
  CHECK(p.grad_accum == 4);
  // 2 layers, hidden 96, heads 6 (head_dim 16), inter 128, vocab 256, untied:
  const int64_t layer = 96 * 96 * 4 + 3 * 96 * 128 + 2 * 96;
  CHECK(p.total_params - p.trainable_params == 256 * 96 * 2 + 2 * layer + 96);
  // LoRA r=4 on q,k,v,o (96->96), gate/up (96->128), down (128->96), per layer:
  CHECK(p.trainable_params == 2 * 4 * (4 * (96 + 96) + 3 * (96 + 128)));
  Plan p2 = make_plan(load_recipe(kSingle, {"distributed.dp_size=2"}), 2);
  CHECK(p2.grad_accum == 2);
  CHECK(p2.memory_estimate_bytes > 0);
}

TEST_CASE("recipe: total_steps is min(max_steps, num_epochs x batches per epoch), never wrapped") {
  StepSchedulerRecipe st;
  st.num_epochs = 2;
  CHECK(st.total_steps(6) == 12);  // no step cap
  st.max_steps = 9;
  CHECK(st.total_steps(6) == 9);  // the cap comes first
  st.max_steps = 100;
  CHECK(st.total_steps(6) == 12);  // the epochs come first
  // A huge num_epochs means "until max_steps": 2^62 x 4 wrapped to 0 steps (a run that trained
  // nothing and exited 0), INT64_MAX x 6 to a negative count.
  st.num_epochs = int64_t{1} << 62;
  st.max_steps = 10;
  CHECK(st.total_steps(4) == 10);
  st.num_epochs = std::numeric_limits<int64_t>::max();
  CHECK(st.total_steps(6) == 10);
  st.max_steps = 0;
  CHECK(st.total_steps(6) == std::numeric_limits<int64_t>::max());
}
