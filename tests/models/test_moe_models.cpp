// The MoE families against transformers: tiny random Qwen3MoeForCausalLM (3 layers, layer 1 dense
// through mlp_only_layers) and MixtralForCausalLM saved by tests/golden/make_moe_model_fixture.py
// (tests/golden/{qwen3_moe,mixtral}_debug/, moe_models.json): loaded from config.json + safetensors
// under HF names, logits of a fixed batch equal HF's, and the loss with router_aux_loss_coef *
// load-balancing loss (HF with output_router_logits) too; the sidecar's TP plan; config errors.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gradcheck.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/flops.h"
#include "models/transformer/load.h"
#include "parallel/model_parallelizer.h"

using namespace dtr;
using dtr::testing::max_abs_diff;
using json = nlohmann::json;

namespace {
/// f32 both sides, 3 layers of 32-wide products and softmaxes in other orders: ~1e-6 on logits ~0.1.
constexpr double kLogitTol = 2e-5;
constexpr double kLossRelTol = 1e-5;

const json& fixture() {
  static const json j = [] {
    std::ifstream f("tests/golden/moe_models.json");  // ctest runs from the source root
    REQUIRE(f.good());
    return json::parse(f);
  }();
  return j;
}
}  // namespace

TEST_CASE("Qwen3-MoE and Mixtral logits and loss equal transformers'", "[moe][golden]") {
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    INFO(name);
    const json& c = fixture()[name];
    auto m = load_model_hf(std::string("tests/golden/") + name + "_debug");
    CHECK(m->type_name() == (std::string(name) == "mixtral" ? "MixtralForCausalLM" : "Qwen3MoeForCausalLM"));
    CHECK(nn::moe_modules(*m).size() == (std::string(name) == "mixtral" ? 2u : 2u));  // qwen3: layer 1 dense
    m->eval();
    const Tensor ids = from_vector<int64_t>(c["ids"].get<std::vector<int64_t>>(), c["shape"].get<Shape>());
    const Tensor logits = m->call(ids);
    const Tensor ref = from_vector<double>(c["logits"].get<std::vector<double>>(), logits.sizes());
    CHECK(max_abs_diff(to_dtype(logits, DType::f64), ref) < kLogitTol);
    const double loss = m->forward_loss(ids, ids).item<double>();
    CHECK(loss == Approx(c["loss"].get<double>()).epsilon(kLossRelTol));
    std::vector<nn::RouterStats> st;
    for (auto& moe : nn::moe_modules(*m)) st.push_back(moe->last_router_stats());
    CHECK(nn::load_balancing_loss(st).item<double>() == Approx(c["aux_loss"].get<double>()).epsilon(kLossRelTol));
  }
}

TEST_CASE("MoE families: dense layers, TP plan and config errors", "[moe]") {
  auto q = load_model_hf("tests/golden/qwen3_moe_debug");
  CHECK(q->config().is_moe_layer(0));
  CHECK_FALSE(q->config().is_moe_layer(1));
  CHECK(q->get_submodule("model.layers.1.mlp")->has_module("gate_proj"));
  CHECK(q->get_submodule("model.layers.0.mlp")->has_module("experts"));
  MeshContext ctx;
  ctx.tp_size = 2;
  auto has_mlp = [](const ParallelizePlan& p) {
    for (auto& [k, s] : p)
      if (k.find(".mlp.") != std::string::npos) return true;
    return false;
  };
  CHECK(has_mlp(parallelizer_for(*q)->tp_plan(*q, ctx)));  // layer 1's dense MLP
  auto x = load_model_hf("tests/golden/mixtral_debug");
  CHECK_FALSE(has_mlp(parallelizer_for(*x)->tp_plan(*x, ctx)));  // every MLP is MoE: experts go to ep
  std::ifstream f("tests/golden/qwen3_moe_debug/config.json");
  json j = json::parse(f);
  j["num_experts_per_tok"] = 9;
  CHECK_THROWS_WITH(model_config_from_json(j, "cfg").validate("cfg"), Catch::Contains("num_experts_per_tok = 9"));
  j.erase("num_experts_per_tok");
  CHECK_THROWS_WITH(model_config_from_json(j, "cfg"), Catch::Contains("num_experts_per_tok"));
}

TEST_CASE("MoE FLOPs count the active weights: router + top-k experts", "[moe]") {
  // llama_matmul_weights (the MFU formula of dtr-train and the benches) against the model's own
  // matmul parameters, grouped experts scaled by k / E (active_weights): Qwen3-MoE with a dense
  // layer, Mixtral all MoE. Before MoE counting, every layer was 3 x hidden x intermediate_size.
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    INFO(name);
    auto m = load_model_hf(std::string("tests/golden/") + name + "_debug");
    const ModelConfig& c = m->config();
    double active = 0, experts = 0;
    for (const auto& [n, p] : m->named_parameters()) {
      if (p.dim() < 2 || n.find("embed_tokens") != std::string::npos) continue;  // norms, lookups
      active += active_weights(c, n, p.numel());
      if (n.find("mlp.experts.") != std::string::npos) experts += static_cast<double>(p.numel());
    }
    if (c.tie_word_embeddings) active += static_cast<double>(c.hidden_size * c.vocab_size);  // lm_head
    CHECK(experts > 0);
    CHECK(llama_matmul_weights(c) == Approx(active).epsilon(1e-12));
    CHECK(active_weights(c, "model.layers.0.mlp.experts.gate_up_proj", 120) ==
          120.0 * c.num_experts_per_tok / c.num_experts);
    CHECK(active_weights(c, "model.layers.0.self_attn.q_proj.weight", 120) == 120.0);
  }
}
