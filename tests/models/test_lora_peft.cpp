// PEFT adapters: dtr's LoRA logits against PEFT's (fixture tests/golden/llama_debug.json and
// the adapter PEFT wrote, tests/golden/llama_debug_adapter/), the exact key names and config
// fields PEFT expects in an adapter written by dtr, import of PEFT's adapter, dtr round trip,
// merged export, regex targets, bad configs.
// Set DTR_PEFT_EXPORT_DIR to keep dtr's adapter for
//   python tests/golden/make_llama_fixture.py --check-dtr-adapter $DTR_PEFT_EXPORT_DIR
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gradcheck.h"
#include "models/formats/safetensors.h"
#include "models/transformer/load.h"
#include "models/lora/peft.h"
#include "tensor/autograd/grad_mode.h"
#include "test_util.h"

using namespace dtr;
using dtr::testing::max_abs_diff;

namespace {

// f32 vs PEFT on the same weights: summation order only (see test_llama.cpp); the adapter adds
// one rank-4 product per projection. Measured 2.1e-7 (rsLoRA 1.8e-7).
constexpr double kLogitTol = 1e-5;

const char* kDebugDir = "tests/golden/llama_debug";
const char* kPeftDir = "tests/golden/llama_debug_adapter";

nlohmann::json fixture() {
  std::ifstream in("tests/golden/llama_debug.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in)["debug"];
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

Tensor fixture_ids(const nlohmann::json& j) {
  std::vector<int64_t> v;
  for (const auto& row : j["input_ids"])
    for (const auto& x : row) v.push_back(x.get<int64_t>());
  return from_vector(v, {2, static_cast<int64_t>(v.size()) / 2});
}

/// The deterministic adapter values of make_llama_fixture.py: module k in sorted FQN order,
/// element i: A = 0.05 sin(0.7 i + 1.3 k), B = 0.05 cos(0.3 i + 0.9 k) (f64, stored as f32).
void set_fixture_values(nn::Module& m) {
  auto loras = lora_modules(m);
  std::sort(loras.begin(), loras.end(), [](auto& a, auto& b) { return a.first < b.first; });
  NoGradGuard ng;
  for (size_t k = 0; k < loras.size(); ++k) {
    for (int which = 0; which < 2; ++which) {
      Tensor w = which == 0 ? loras[k].second->lora_A()->weight() : loras[k].second->lora_B()->weight();
      std::vector<float> v(static_cast<size_t>(w.numel()));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<float>(which == 0 ? 0.05 * std::sin(0.7 * i + 1.3 * k) : 0.05 * std::cos(0.3 * i + 0.9 * k));
      w.copy_(from_vector(v, w.sizes()));
    }
  }
}

std::shared_ptr<LlamaForCausalLM> lora_model(bool rslora) {
  auto m = load_model_hf(kDebugDir);
  m->eval();
  LoraConfig cfg;  // default targets *_proj = q,k,v,o,gate,up,down (PEFT fixture's list)
  cfg.options.r = 4;
  cfg.options.alpha = 8;
  cfg.options.use_rslora = rslora;
  apply_lora(*m, cfg);
  set_fixture_values(*m);
  return m;
}

Tensor fixture_logits(const nlohmann::json& j, const char* key) {
  return from_vector(j[key].get<std::vector<float>>(), j["logits_shape"].get<std::vector<int64_t>>());
}

}  // namespace

TEST_CASE("LoRA logits match PEFT (plain and rsLoRA)") {
  auto j = fixture();
  const Tensor ids = fixture_ids(j);
  for (bool rs : {false, true}) {
    auto m = lora_model(rs);
    const double d = max_abs_diff(m->forward(ids), fixture_logits(j, rs ? "logits_lora_rslora" : "logits_lora"));
    WARN("LoRA" << (rs ? " (rsLoRA)" : "") << ": max |logits - PEFT| = " << d);
    CHECK(d < kLogitTol);
  }
  // The FQNs PEFT adapted, in sorted order, equal dtr's.
  auto m = lora_model(false);
  std::vector<std::string> fqns;
  for (auto& [f, l] : lora_modules(*m)) fqns.push_back(f);
  std::sort(fqns.begin(), fqns.end());
  CHECK(fqns == j["lora_fqns"].get<std::vector<std::string>>());
}

TEST_CASE("save_peft_adapter writes what PEFT writes: keys, shapes, values, config") {
  auto m = lora_model(false);
  dtr::test::TempDir dir("peft_save");
  const char* keep = std::getenv("DTR_PEFT_EXPORT_DIR");
  const std::string out = keep ? std::string(keep) : dir.path.string();
  save_peft_adapter(*m, out, "tests/golden/llama_debug");

  auto ours = safetensors::SafetensorsFile::open(out + "/adapter_model.safetensors");
  auto peft = safetensors::SafetensorsFile::open(std::string(kPeftDir) + "/adapter_model.safetensors");
  auto ok = ours.keys(), pk = peft.keys();
  std::sort(ok.begin(), ok.end());
  std::sort(pk.begin(), pk.end());
  CHECK(ok == pk);  // e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
  CHECK(ok.size() == 28);
  for (const auto& k : pk) {
    if (!ours.contains(k)) continue;
    CHECK(ours.entry(k).dtype == peft.entry(k).dtype);
    CHECK(ours.entry(k).shape == peft.entry(k).shape);
    CHECK(max_abs_diff(ours.get(k), peft.get(k)) < 1e-8);  // same formula, f64 -> f32
  }
  auto oc = read_json(out + "/adapter_config.json");
  auto pc = read_json(std::string(kPeftDir) + "/adapter_config.json");
  for (const char* key : {"peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "bias", "use_rslora", "use_dora"})
    CHECK(oc[key] == pc[key]);
  auto ot = oc["target_modules"].get<std::vector<std::string>>(), pt = pc["target_modules"].get<std::vector<std::string>>();
  std::sort(pt.begin(), pt.end());
  CHECK(ot == pt);  // PEFT writes a set: order differs
  CHECK(oc["base_model_name_or_path"] == "tests/golden/llama_debug");
}

TEST_CASE("load_peft_adapter: PEFT's adapter gives PEFT's logits; dtr's own round trips bit-exact") {
  auto j = fixture();
  const Tensor ids = fixture_ids(j);
  {
    auto m = load_model_hf(kDebugDir);
    m->eval();
    auto adapted = load_peft_adapter(*m, kPeftDir);
    CHECK(adapted.size() == 14);
    for (auto& [fqn, l] : lora_modules(*m)) CHECK(l->options().dropout_position == nn::LoraDropoutPosition::pre);
    CHECK(max_abs_diff(m->forward(ids), fixture_logits(j, "logits_lora")) < kLogitTol);
    for (auto& [fqn, p] : m->named_parameters()) CHECK(p.requires_grad() == is_lora_parameter(fqn));
  }
  auto m = lora_model(true);
  const Tensor ref = m->forward(ids);
  dtr::test::TempDir dir("peft_rt");
  save_peft_adapter(*m, dir.path.string());
  auto m2 = load_model_hf(kDebugDir);
  m2->eval();
  load_peft_adapter(*m2, dir.path.string());
  CHECK(lora_modules(*m2).front().second->options().use_rslora);
  CHECK(max_abs_diff(m2->forward(ids), ref) == 0.0);
  CHECK_THROWS_WITH(load_peft_adapter(*m2, dir.path.string()), Catch::Contains("already has LoRA"));
}

TEST_CASE("merged export: HF directory without lora keys, same logits") {
  auto j = fixture();
  const Tensor ids = fixture_ids(j);
  auto m = lora_model(false);
  const Tensor ref = m->forward(ids);
  dtr::test::TempDir dir("peft_merged");
  save_merged_model(*m, dir.path.string());
  CHECK_FALSE(lora_modules(*m).front().second->merged());  // the model is unchanged
  auto f = safetensors::SafetensorsFile::open(dir.file("model.safetensors"));
  for (const auto& k : f.keys()) CHECK(k.find("lora") == std::string::npos);
  auto merged = load_model_hf(dir.path.string());
  merged->eval();
  const double d = max_abs_diff(merged->forward(ids), ref);
  CHECK(d < kLogitTol);
  CHECK(max_abs_diff(merged->forward(ids), fixture_logits(j, "logits_lora")) < kLogitTol);
}

TEST_CASE("PEFT target_modules: regex form when short names would select too much") {
  auto m = load_model_hf(kDebugDir);
  LoraConfig cfg;
  cfg.target_modules = {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"};
  cfg.options.r = 2;
  apply_lora(*m, cfg);
  dtr::test::TempDir dir("peft_regex");
  save_peft_adapter(*m, dir.path.string());
  auto c = read_json(dir.file("adapter_config.json"));
  REQUIRE(c["target_modules"].is_string());
  CHECK(c["target_modules"].get<std::string>() ==
        "(model\\.layers\\.0\\.self_attn\\.q_proj|model\\.layers\\.1\\.mlp\\.down_proj)");
  auto m2 = load_model_hf(kDebugDir);
  CHECK(load_peft_adapter(*m2, dir.path.string()) == cfg.target_modules);
}

TEST_CASE("PEFT: bad adapter configs and files") {
  dtr::test::TempDir dir("peft_bad");
  auto m = lora_model(false);
  save_peft_adapter(*m, dir.path.string());
  auto c = read_json(dir.file("adapter_config.json"));
  auto write = [&](const nlohmann::json& x) { std::ofstream(dir.file("adapter_config.json")) << x.dump(); };
  auto fresh = [] { return load_model_hf(kDebugDir); };
  auto bad = c;
  bad["bias"] = "all";
  write(bad);
  CHECK_THROWS_WITH(load_peft_adapter(*fresh(), dir.path.string()), Catch::Contains("bias"));
  bad = c;
  bad["peft_type"] = "IA3";
  write(bad);
  CHECK_THROWS_WITH(load_peft_adapter(*fresh(), dir.path.string()), Catch::Contains("peft_type"));
  bad = c;
  bad.erase("r");
  write(bad);
  CHECK_THROWS_WITH(load_peft_adapter(*fresh(), dir.path.string()),
                    Catch::Contains("adapter_config.json") && Catch::Contains("\"r\""));
  bad = c;
  bad["r"] = 8;  // shapes in the file are rank 4
  write(bad);
  CHECK_THROWS_WITH(load_peft_adapter(*fresh(), dir.path.string()),
                    Catch::Contains("adapter_model.safetensors") && Catch::Contains("lora_A.weight"));
  bad = c;
  bad["target_modules"] = {"q_proj"};  // the file holds k_proj etc. too
  write(bad);
  CHECK_THROWS_WITH(load_peft_adapter(*fresh(), dir.path.string()),
                    Catch::Contains("lora_A.weight") && Catch::Contains("target_modules of adapter_config.json does not"));
  // A regex that makes a backtracking matcher run for ever (std::regex did, before
  // ModuleMatcher): answered at once, it selects nothing.
  bad = c;
  bad["target_modules"] = "(.*.*)*q_projX";
  write(bad);
  CHECK_THROWS_WITH(load_peft_adapter(*fresh(), dir.path.string()),
                    Catch::Contains("adapter_config.json") && Catch::Contains("selects no Linear module"));
  bad["target_modules"] = "(q_proj";
  write(bad);
  CHECK_THROWS_WITH(load_peft_adapter(*fresh(), dir.path.string()),
                    Catch::Contains("adapter_config.json") && Catch::Contains("does not compile"));
  CHECK_THROWS_WITH(save_peft_adapter(*fresh(), dir.file("x")), Catch::Contains("no LoRALinear"));
}

TEST_CASE("PEFT adapter with target_parameters on Qwen3-MoE experts: load, logits, export, merge") {
  // tests/golden/make_moe_peft_fixture.py: PEFT 0.21 LoRA on q_proj / o_proj and
  // target_parameters experts.gate_up_proj / experts.down_proj of the tiny Qwen3-MoE (r 2, alpha 6,
  // nonzero A and B), the logits of the model PEFT reloaded from that directory.
  const char* kMoeDir = "tests/golden/qwen3_moe_debug";
  const char* kMoeAdapter = "tests/golden/qwen3_moe_debug_adapter";
  const nlohmann::json j = read_json("tests/golden/qwen3_moe_adapter.json");
  const Tensor ids = from_vector<int64_t>(j["ids"].get<std::vector<int64_t>>(), j["shape"].get<Shape>());
  auto m = load_model_hf(kMoeDir);
  m->eval();
  auto adapted = load_peft_adapter(*m, kMoeAdapter);
  CHECK(adapted.size() == 3 * 2 + 2);  // q, o of 3 layers + the experts of layers 0 and 2 (1 is dense)
  CHECK(std::count(adapted.begin(), adapted.end(), "model.layers.2.mlp.experts") == 1);
  for (auto& [fqn, p] : m->named_parameters()) CHECK(p.requires_grad() == is_lora_parameter(fqn));
  const Tensor logits = m->forward(ids);
  const Tensor ref = from_vector<double>(j["logits"].get<std::vector<double>>(), logits.sizes());
  CHECK(max_abs_diff(to_dtype(logits, DType::f64), ref) < 2e-5);  // f32, as the MoE model golden test

  // export: PEFT's tensors back bit for bit, its target_modules and target_parameters
  dtr::test::TempDir dir("peft_moe");
  save_peft_adapter(*m, dir.file("adapter"), kMoeDir);
  auto ours = safetensors::SafetensorsFile::open(dir.file("adapter") + "/adapter_model.safetensors");
  auto peft = safetensors::SafetensorsFile::open(std::string(kMoeAdapter) + "/adapter_model.safetensors");
  auto ok = ours.keys(), pk = peft.keys();
  std::sort(ok.begin(), ok.end());
  std::sort(pk.begin(), pk.end());
  CHECK(ok == pk);  // ...mlp.experts.base_layer.lora_A.weight (gate_up_proj), ...mlp.experts.lora_A.weight (down)
  for (const auto& k : pk)
    if (ours.contains(k)) CHECK(max_abs_diff(ours.get(k), peft.get(k)) == 0);
  auto oc = read_json(dir.file("adapter") + "/adapter_config.json");
  auto pc = read_json(std::string(kMoeAdapter) + "/adapter_config.json");
  for (const char* key : {"target_modules", "target_parameters"}) {
    auto o = oc[key].get<std::vector<std::string>>(), p = pc[key].get<std::vector<std::string>>();
    std::sort(o.begin(), o.end());
    std::sort(p.begin(), p.end());
    CHECK(o == p);
  }

  // merged export: W_e + scale B_e A_e per expert gives the adapted logits without LoRA
  save_model_hf(*m, dir.file("merged"));
  auto merged = load_model_hf(dir.file("merged"));
  merged->eval();
  CHECK(lora_modules(*merged).empty());
  CHECK(max_abs_diff(merged->forward(ids), logits) < 1e-5);
}
