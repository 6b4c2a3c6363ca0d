// nn::MoE against transformers' sparse MoE blocks (CPU, f64): fixture tests/golden/moe_blocks.json
// written by tests/golden/make_moe_fixture.py (Qwen3-MoE with and without norm_topk_prob, Mixtral,
// Qwen2-MoE with its gated shared expert). The HF parameters load under the same names; outputs,
// the input gradient and every parameter gradient of sum(out * w), w = cos(0.37 i + 0.1), and HF's
// load_balancing_loss_func on the block's router logits.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gradcheck.h"
#include "tensor/nn/moe.h"

using namespace dtr;
using dtr::testing::max_abs_diff;
using json = nlohmann::json;

namespace {

/// HF computes the router softmax in float32 (softmax(..., dtype=float) / logits.float()) even for
/// f64 blocks, so routing weights carry f32 rounding (~6e-8 relative) into outputs ~1 and
/// gradients ~10; the aux loss is accumulated in float32 too.
constexpr double kTol = 2e-6;
constexpr double kAuxRelTol = 1e-6;

const json& fixture() {
  static const json j = [] {
    std::ifstream f("tests/golden/moe_blocks.json");  // ctest runs from the source root
    REQUIRE(f.good());
    return json::parse(f);
  }();
  return j;
}

Tensor T64(const json& t) {
  return from_vector<double>(t["data"].get<std::vector<double>>(), t["shape"].get<Shape>());
}

/// Qwen2-MoE's shared expert: down_proj(silu(gate_proj(x)) * up_proj(x)).
struct GatedMLP : nn::Module {
  GatedMLP(int64_t h, int64_t i) {
    register_module("gate_proj", std::make_shared<nn::Linear>(h, i, false, DType::f64));
    register_module("up_proj", std::make_shared<nn::Linear>(h, i, false, DType::f64));
    register_module("down_proj", std::make_shared<nn::Linear>(i, h, false, DType::f64));
  }
  Tensor forward(const Tensor& x) override {
    return get_submodule("down_proj")->call(swiglu(get_submodule("gate_proj")->call(x), get_submodule("up_proj")->call(x)));
  }
};

}  // namespace

TEST_CASE("MoE blocks equal transformers' (Qwen3-MoE, Mixtral, Qwen2-MoE shared expert)", "[moe][golden]") {
  for (const char* name : {"qwen3_moe", "qwen3_nonorm", "mixtral", "qwen2_moe"}) {
    INFO(name);
    const json& c = fixture()[name];
    const Tensor x0 = T64(c["x"]);
    nn::MoEConfig mc;
    mc.hidden_size = x0.size(-1);
    mc.moe_intermediate_size = c["I"];
    mc.num_experts = c["experts"];
    mc.num_experts_per_tok = c["top_k"];
    mc.norm_topk_prob = c["norm"];
    const bool shared = c.contains("shared_I");
    auto se = shared ? std::make_shared<GatedMLP>(mc.hidden_size, c["shared_I"].get<int64_t>()) : nullptr;
    auto m = std::make_shared<nn::MoE>(mc, DType::f64, false, se, shared);
    nn::StateDict sd;
    for (auto& [k, v] : c["params"].items()) sd[k] = T64(v);
    m->load_state_dict(sd);  // strict: every HF name exists here and nothing else
    for (auto& p : m->parameters()) p.set_requires_grad(true);
    Tensor x = x0.clone().set_requires_grad(true);
    Tensor y = m->call(x);
    CHECK(max_abs_diff(y, T64(c["out"])) < kTol);
    sum(mul(y, dtr::testing::golden_grad_weight(y.sizes()))).backward();
    CHECK(max_abs_diff(x.grad(), T64(c["dx"])) < kTol);
    for (auto& [k, g] : c["grads"].items()) {
      INFO(k);
      CHECK(max_abs_diff(m->get_parameter(k).grad(), T64(g)) < kTol);
    }
    const double aux = nn::load_balancing_loss({m->last_router_stats()}).item<double>();
    CHECK(aux == Approx(c["aux_loss"].get<double>()).epsilon(kAuxRelTol));
  }
}
