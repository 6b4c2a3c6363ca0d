// LoRA on grouped experts (nn::GroupedExperts::enable_lora) against PEFT's ParamWrapper LoRA on
// transformers' Qwen3MoeSparseMoeBlock (fixture tests/golden/moe_blocks.json, case qwen3_lora,
// from tests/golden/make_moe_fixture.py): the PEFT adapter loads into the grouped layout, the block
// output, input gradient and adapter gradients equal PEFT's, and the export gives back PEFT's
// tensors exactly; finite differences on the adapters; base frozen; errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gradcheck.h"
#include "models/lora/peft_experts.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::max_abs_diff;
using json = nlohmann::json;

namespace {
/// HF's router softmax runs in float32 even for f64 blocks (see test_moe_golden.cpp).
constexpr double kTol = 2e-6;

const json& fixture() {
  static const json j = [] {
    std::ifstream f("tests/golden/moe_blocks.json");  // ctest runs from the source root
    REQUIRE(f.good());
    return json::parse(f)["qwen3_lora"];
  }();
  return j;
}
Tensor T64(const json& t) { return from_vector<double>(t["data"].get<std::vector<double>>(), t["shape"].get<Shape>()); }
std::map<std::string, Tensor> tensors(const json& j) {
  std::map<std::string, Tensor> m;
  for (auto& [k, v] : j.items()) m[k] = T64(v);
  return m;
}

std::shared_ptr<nn::MoE> make_lora_moe(const json& c) {
  nn::MoEConfig mc;
  mc.hidden_size = 8;
  mc.moe_intermediate_size = c["I"];
  mc.num_experts = c["experts"];
  mc.num_experts_per_tok = c["top_k"];
  mc.norm_topk_prob = c["norm"];
  auto m = std::make_shared<nn::MoE>(mc, DType::f64, false);
  nn::StateDict sd;
  for (auto& [k, v] : tensors(c["params"])) sd[k] = v;
  m->load_state_dict(sd);
  nn::LoraOptions o;
  o.r = c["r"];
  o.alpha = c["alpha"];
  m->experts()->enable_lora(o);
  return m;
}

}  // namespace

TEST_CASE("grouped expert LoRA equals PEFT's (target_parameters) on Qwen3-MoE", "[lora][moe][golden]") {
  const json& c = fixture();
  auto m = make_lora_moe(c);
  auto ex = m->experts();
  CHECK_FALSE(ex->parameter("gate_up_proj").requires_grad());  // base frozen
  CHECK(ex->lora_scaling() == 3.0);                             // alpha 6 / r 2
  load_peft_expert_lora("experts", tensors(c["adapter"]), *ex);
  // export gives PEFT's tensors back exactly
  for (auto& [k, t] : peft_expert_lora_tensors("experts", *ex)) {
    INFO(k);
    CHECK(max_abs_diff(t, T64(c["adapter"][k])) == 0.0);
  }
  Tensor x = T64(c["x"]).set_requires_grad(true);
  Tensor y = m->call(x);
  CHECK(max_abs_diff(y, T64(c["out"])) < kTol);
  sum(mul(y, dtr::testing::golden_grad_weight(y.sizes()))).backward();
  CHECK(max_abs_diff(x.grad(), T64(c["dx"])) < kTol);
  // PEFT's adapter gradients brought into the grouped layout, beside dtr's
  auto ref = make_lora_moe(c);
  load_peft_expert_lora("experts", tensors(c["grads"]), *ref->experts());
  for (const char* n : {"gate_up_proj_lora_A", "gate_up_proj_lora_B", "down_proj_lora_A", "down_proj_lora_B"}) {
    INFO(n);
    CHECK(max_abs_diff(ex->parameter(n).grad(), ref->experts()->parameter(n)) < kTol);
  }
  CHECK_FALSE(ex->parameter("gate_up_proj").grad().defined());
}

TEST_CASE("grouped expert LoRA gradients match finite differences", "[lora][moe][grad]") {
  manual_seed(31);
  auto m = make_lora_moe(fixture());
  auto ex = m->experts();
  for (const char* n : {"gate_up_proj_lora_B", "down_proj_lora_B"})
    ex->set_parameter(n, uniform(ex->parameter(n).sizes(), -0.5, 0.5, TensorOptions(DType::f64)).set_requires_grad(true));
  const char* names[] = {"gate_up_proj_lora_A", "gate_up_proj_lora_B", "down_proj_lora_A", "down_proj_lora_B"};
  std::vector<Tensor> in{uniform({7, 8}, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true)};
  for (const char* n : names) in.push_back(ex->parameter(n).detach().clone().set_requires_grad(true));
  auto f = [&](const std::vector<Tensor>& v) {
    for (int i = 0; i < 4; ++i) ex->set_parameter(names[i], v[i + 1]);
    return m->call(v[0]);
  };
  CHECK(dtr::testing::gradcheck(f, in) == "");
}

TEST_CASE("grouped expert LoRA errors", "[lora][moe]") {
  nn::GroupedExperts e(2, 4, 3, DType::f64);
  nn::LoraOptions o;
  o.dropout = 0.1;
  CHECK_THROWS_WITH(e.enable_lora(o), Catch::Contains("dropout on experts is not built"));
  CHECK_THROWS_WITH(peft_expert_lora_tensors("experts", e), Catch::Contains("has no LoRA"));
  o.dropout = 0;
  e.enable_lora(o);
  CHECK_THROWS_WITH(e.enable_lora(o), Catch::Contains("already enabled"));
  std::map<std::string, Tensor> sd = peft_expert_lora_tensors("experts", e);
  sd.erase("experts.lora_B.weight");
  CHECK_THROWS_WITH(load_peft_expert_lora("experts", sd, e), Catch::Contains("missing key experts.lora_B.weight"));
  sd["experts.lora_B.weight"] = zeros({3, 3}, TensorOptions(DType::f64));
  CHECK_THROWS_WITH(load_peft_expert_lora("experts", sd, e), Catch::Contains("expected [4, 16]"));
}
