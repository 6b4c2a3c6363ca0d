// apply_lora: FQN pattern matching, exclusion, freezing, no double wrapping, gradients only
// on adapter weights, merge_lora / unmerge_lora over a tree.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "models/transformer/causal_lm.h"
#include "models/lora/inject.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::max_abs_diff;

namespace {

std::shared_ptr<LlamaForCausalLM> debug_model() {
  manual_seed(42);
  return std::make_shared<LlamaForCausalLM>(llama_debug_config());
}

Tensor ids_2x8() {
  std::vector<int64_t> v;
  for (int i = 0; i < 16; ++i) v.push_back((i * 37 + 5) % 128);
  return from_vector(v, {2, 8});
}

}  // namespace

TEST_CASE("wildcard_match and the target pattern rule") {
  CHECK(wildcard_match("*_proj", "model.layers.0.self_attn.q_proj"));
  CHECK_FALSE(wildcard_match("*_proj", "lm_head"));
  CHECK(wildcard_match("model.layers.1.*", "model.layers.1.mlp.up_proj"));
  CHECK_FALSE(wildcard_match("model.layers.1.*", "model.layers.10.mlp.up_proj"));
  CHECK(wildcard_match("*", ""));
  CHECK(wildcard_match("a*b*c", "axxbyyc"));
  CHECK_FALSE(wildcard_match("a*b*c", "axxbyy"));
  CHECK(wildcard_match("exact", "exact"));
  CHECK_FALSE(wildcard_match("exact", "exactly"));
  // A pattern without '*' matches the module's own name or the whole FQN.
  CHECK(lora_pattern_matches("q_proj", "model.layers.0.self_attn.q_proj"));
  CHECK_FALSE(lora_pattern_matches("proj", "model.layers.0.self_attn.q_proj"));
  CHECK(lora_pattern_matches("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.q_proj"));
}

TEST_CASE("apply_lora: default targets *_proj, frozen base, unchanged output") {
  auto m = debug_model();
  m->eval();
  const Tensor ids = ids_2x8();
  const Tensor before = m->forward(ids);
  LoraConfig cfg;
  cfg.options.r = 4;
  cfg.options.alpha = 8;
  auto replaced = apply_lora(*m, cfg);
  std::vector<std::string> expect;
  for (int l = 0; l < 2; ++l)
    for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                          "mlp.up_proj", "mlp.down_proj"})
      expect.push_back("model.layers." + std::to_string(l) + "." + n);
  CHECK(replaced == expect);
  CHECK(m->get_submodule("model.layers.0.self_attn.q_proj")->type_name() == "LoRALinear");
  CHECK(m->get_submodule("lm_head")->type_name() == "Linear");
  // Base names unchanged (NeMo layout), adapters beside them.
  auto sd = m->state_dict();
  CHECK(sd.count("model.layers.0.self_attn.q_proj.weight"));
  CHECK(sd.count("model.layers.0.self_attn.q_proj.lora_A.weight"));
  CHECK(sd.at("model.layers.1.mlp.down_proj.lora_B.weight").sizes() == Shape{64, 4});
  int trainable = 0;
  for (auto& [fqn, p] : m->named_parameters()) {
    CHECK(p.requires_grad() == is_lora_parameter(fqn));
    trainable += p.requires_grad();
  }
  CHECK(trainable == 28);
  CHECK(max_abs_diff(m->forward(ids), before) == 0.0);  // B = 0

  // Only adapter weights receive gradients (B gets one, A's is zero while B = 0).
  m->train();
  m->forward_loss(ids, ids).backward();
  for (auto& [fqn, p] : m->named_parameters()) CHECK(p.grad().defined() == is_lora_parameter(fqn));

  // Applying again wraps nothing twice: nothing left to match.
  CHECK_THROWS_WITH(apply_lora(*m, cfg), Catch::Contains("no Linear module matches"));
}

TEST_CASE("apply_lora: short names, FQN wildcards, exclusion") {
  {
    auto m = debug_model();
    LoraConfig cfg;
    cfg.target_modules = {"q_proj", "v_proj"};
    auto r = apply_lora(*m, cfg);
    CHECK(r == std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                                        "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"});
  }
  {
    auto m = debug_model();
    LoraConfig cfg;
    cfg.target_modules = {"model.layers.1.*"};
    CHECK(apply_lora(*m, cfg).size() == 7);
  }
  {
    auto m = debug_model();
    LoraConfig cfg;
    cfg.exclude_modules = {"*.mlp.*", "model.layers.0.self_attn.k_proj"};
    auto r = apply_lora(*m, cfg);
    CHECK(r.size() == 7);
    for (const auto& f : r) CHECK(f.find(".mlp.") == std::string::npos);
  }
  {
    auto m = debug_model();
    LoraConfig cfg;
    cfg.target_modules = {"*"};  // every Linear, lm_head included (NeMo's match_all_linear)
    auto r = apply_lora(*m, cfg);
    CHECK(r.size() == 15);
    CHECK(r.back() == "lm_head");
  }
  {
    auto m = debug_model();
    LoraConfig cfg;
    cfg.target_modules = {"nothing_*"};
    CHECK_THROWS_WITH(apply_lora(*m, cfg), Catch::Contains("nothing_*") && Catch::Contains("self_attn.q_proj"));
  }
}

TEST_CASE("merge_lora / unmerge_lora over the tree") {
  auto m = debug_model();
  m->eval();
  LoraConfig cfg;
  cfg.options.r = 2;
  cfg.options.alpha = 4;
  apply_lora(*m, cfg);
  {
    NoGradGuard ng;
    for (auto& [fqn, l] : lora_modules(*m)) l->lora_B()->weight().copy_(normal(l->lora_B()->weight().sizes(), 0, 0.1));
  }
  const Tensor ids = ids_2x8();
  const Tensor y = m->forward(ids);
  CHECK(merge_lora(*m) == 14);
  CHECK(merge_lora(*m) == 0);
  // f32: merged W + scale * B A is summed in another order than the two-branch forward.
  CHECK(max_abs_diff(m->forward(ids), y) < 1e-5);
  CHECK(unmerge_lora(*m) == 14);
  CHECK(max_abs_diff(m->forward(ids), y) < 1e-5);
}
