// LlamaForCausalLM on the debug config: Hugging Face names, tying, causality, the loss helper,
// HF directory import/export, and parity with transformers (tests/golden/llama_debug*, made by
// tests/golden/make_llama_fixture.py): logits, loss and gradients.
#include <catch2/catch.hpp>
#include <cmath>
#include <iomanip>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gradcheck.h"
#include "models/formats/safetensors.h"
#include "models/transformer/load.h"
#include "tensor/profiler.h"
#include "tensor/random.h"
#include "test_util.h"

using namespace dtr;
using dtr::testing::max_abs_diff;

namespace {

// f32 against transformers on the same f32 weights: only the summation order differs
// (Eigen GEMM blocking, flash-style online softmax vs eager softmax). Logits are O(1) and pass
// through 2 layers of width 64: measured max |diff| 1.6e-7; 1e-5 leaves margin for other
// thread counts and Eigen kernels.
constexpr double kLogitTol = 1e-5;
constexpr double kLossRelTol = 1e-6;
// Gradients go through one more pass of f32 sums; norms compared relatively.
constexpr double kGradRelTol = 1e-5;

const char* kDebugDir = "tests/golden/llama_debug";

nlohmann::json fixture() {
  std::ifstream in("tests/golden/llama_debug.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in)["debug"];
}

Tensor ids_tensor(const nlohmann::json& j) {
  std::vector<int64_t> v;
  int64_t rows = 0;
  for (const auto& row : j) {
    for (const auto& x : row) v.push_back(x.get<int64_t>());
    ++rows;
  }
  return from_vector(v, {rows, static_cast<int64_t>(v.size()) / rows});
}

double norm(const Tensor& t) {
  double s = 0;
  for (double v : t.to_vector<double>()) s += v * v;
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("Llama: Hugging Face parameter names and shapes") {
  manual_seed(1);
  LlamaForCausalLM m(llama_debug_config());
  auto sd = m.state_dict();
  // Exactly the keys transformers saved for the same config.
  auto file = safetensors::SafetensorsFile::open(std::string(kDebugDir) + "/model.safetensors");
  std::vector<std::string> keys;
  for (auto& [k, t] : sd) keys.push_back(k);
  auto fkeys = file.keys();
  std::sort(fkeys.begin(), fkeys.end());
  CHECK(keys == fkeys);
  for (auto& [k, t] : sd) CHECK(t.sizes() == file.entry(k).shape);
  CHECK(sd.at("model.layers.1.self_attn.k_proj.weight").sizes() == Shape{32, 64});
  CHECK(m.get_submodule("model.layers.0.self_attn")->type_name() == "LlamaAttention");
  // HF init: N(0, 0.02) weights, ones for norms.
  auto w = sd.at("model.layers.0.mlp.up_proj.weight").to_vector<double>();
  double sq = 0;
  for (double v : w) sq += v * v;
  CHECK(std::sqrt(sq / w.size()) == Approx(0.02).epsilon(0.05));
  for (double v : sd.at("model.norm.weight").to_vector<double>()) CHECK(v == 1.0);
}

TEST_CASE("Llama: tied embeddings share one tensor") {
  LlamaConfig c = llama_debug_config();
  c.tie_word_embeddings = true;
  manual_seed(1);
  LlamaForCausalLM m(c);
  CHECK(m.get_parameter("lm_head.weight").is_same(m.get_parameter("model.embed_tokens.weight")));
  CHECK(m.state_dict().count("lm_head.weight") == 1);  // listed under both names
  size_t n = 0;
  for (auto& kv : m.named_parameters()) n += kv.first == "lm_head.weight";
  CHECK(n == 0);  // named_parameters lists the tensor once, under its first name
  // Export omits lm_head (as HF does) and import re-ties.
  dtr::test::TempDir dir("llama_tied");
  save_model_hf(m, dir.path.string());
  auto keys = safetensors::SafetensorsFile::open(dir.file("model.safetensors")).keys();
  CHECK(std::find(keys.begin(), keys.end(), "lm_head.weight") == keys.end());
  auto m2 = load_model_hf(dir.path.string());
  CHECK(m2->tied());
  CHECK(m2->get_parameter("lm_head.weight").is_same(m2->get_parameter("model.embed_tokens.weight")));
  Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4});
  CHECK(max_abs_diff(m2->forward(ids), m.forward(ids)) == 0.0);
}

TEST_CASE("Llama: causal (a later token does not change earlier logits), batch rows independent") {
  manual_seed(2);
  LlamaForCausalLM m(llama_debug_config());
  Tensor a = from_vector(std::vector<int64_t>{5, 9, 17, 33, 65, 3}, {1, 6});
  Tensor b = from_vector(std::vector<int64_t>{5, 9, 17, 33, 65, 100}, {1, 6});
  Tensor la = m.forward(a), lb = m.forward(b);
  CHECK(max_abs_diff(narrow(la, 1, 0, 5), narrow(lb, 1, 0, 5)) < 1e-6);
  CHECK(max_abs_diff(narrow(la, 1, 5, 1), narrow(lb, 1, 5, 1)) > 1e-4);
  Tensor ab = m.forward(cat({a, b}, 0));
  CHECK(max_abs_diff(narrow(ab, 0, 0, 1), la) < 1e-6);
}

TEST_CASE("Llama: attention reads and writes the projections' layout (no copy in forward + backward)") {
  // q / k / v leave their projections as [B, T, H * D]; RoPE and sdpa read them as [B, H, T, D]
  // views and write in that memory order, so no transpose or reshape of the step copies (T = 7:
  // an uneven, partial block; the debug config has GQA).
  manual_seed(4);
  LlamaForCausalLM m(llama_debug_config());
  Tensor ids = to_dtype(mul(rand({2, 7}), 100.0), DType::i64);
  reset_op_profile();
  {
    OpProfilerScope prof;
    m.forward_loss(ids, ids).backward();
  }
  for (const OpProfileEntry& e : op_profile()) {
    INFO(e.name);
    CHECK((e.name != "clone" && e.name != "contiguous" && e.name != "copy_"));
  }
  reset_op_profile();
}

TEST_CASE("causal_lm_loss: shift, ignore_index, unshifted form") {
  manual_seed(3);
  Tensor logits = randn({2, 4, 5}, TensorOptions(DType::f64));
  Tensor labels = from_vector(std::vector<int64_t>{1, 2, -100, 4, 0, 3, 3, -100}, {2, 4});
  // By hand: positions t predict labels[t+1]; targets 2, -100, 4 | 3, 3, -100.
  auto lv = logits.to_vector<double>();
  auto nll = [&](int b, int t, int y) {
    double m = -1e300, s = 0;
    for (int c = 0; c < 5; ++c) m = std::max(m, lv[(b * 4 + t) * 5 + c]);
    for (int c = 0; c < 5; ++c) s += std::exp(lv[(b * 4 + t) * 5 + c] - m);
    return m + std::log(s) - lv[(b * 4 + t) * 5 + y];
  };
  const double ref = (nll(0, 0, 2) + nll(0, 2, 4) + nll(1, 0, 3) + nll(1, 1, 3)) / 4;
  CHECK(causal_lm_loss(logits, labels).item<double>() == Approx(ref).epsilon(1e-14));
  const double ref2 = (nll(0, 0, 1) + nll(0, 1, 2) + nll(0, 3, 4) + nll(1, 0, 0) + nll(1, 1, 3) + nll(1, 2, 3)) / 6;
  CHECK(causal_lm_loss(logits, labels, /*shift=*/false).item<double>() == Approx(ref2).epsilon(1e-14));
  CHECK_THROWS_WITH(causal_lm_loss(logits, narrow(labels, 1, 0, 3)), Catch::Contains("causal_lm_loss"));
}

TEST_CASE("Llama debug model matches transformers: logits, loss, gradients") {
  auto j = fixture();
  auto m = load_model_hf(kDebugDir);
  m->eval();
  CHECK_FALSE(m->tied());
  const Tensor ids = ids_tensor(j["input_ids"]);
  const Tensor labels = ids_tensor(j["labels"]);
  const Tensor logits = m->forward(ids);
  std::vector<int64_t> shape = j["logits_shape"].get<std::vector<int64_t>>();
  REQUIRE(logits.sizes() == shape);
  const Tensor ref = from_vector(j["logits"].get<std::vector<float>>(), shape);
  const double dl = max_abs_diff(logits, ref);
  WARN("debug model: max |logits - HF| = " << dl);
  CHECK(dl < kLogitTol);

  Tensor loss = m->forward_loss(ids, labels);
  const double ref_loss = j["loss"].get<double>();
  WARN("debug model: loss " << std::setprecision(9) << loss.item<float>() << " vs HF " << ref_loss);
  CHECK(loss.item<float>() == Approx(ref_loss).epsilon(kLossRelTol));

  for (auto& p : m->parameters()) p.set_requires_grad(true);
  loss = m->forward_loss(ids, labels);
  loss.backward();
  for (auto& [name, v] : j["grad_norms"].items()) {
    const double g = norm(m->get_parameter(name).grad());
    INFO(name << ": dtr " << g << " HF " << v.get<double>());
    CHECK(g == Approx(v.get<double>()).epsilon(kGradRelTol));
  }
  const Tensor gref = from_vector(j["norm_weight_grad"].get<std::vector<float>>(), {64});
  CHECK(max_abs_diff(m->get_parameter("model.norm.weight").grad(), gref) < kGradRelTol * norm(gref));
}

TEST_CASE("Llama: HF export / import round trip is bit-exact, sharded too") {
  auto m = load_model_hf(kDebugDir);
  dtr::test::TempDir dir("llama_rt");
  save_model_hf(*m, dir.file("one"));
  save_model_hf(*m, dir.file("sharded"), /*max_shard_bytes=*/100'000);
  CHECK(std::filesystem::exists(dir.file("sharded/model.safetensors.index.json")));
  Tensor ids = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
  const Tensor ref = m->forward(ids);
  for (const char* sub : {"one", "sharded"}) {
    auto m2 = load_model_hf(dir.file(sub));
    for (auto& [k, t] : m->state_dict()) CHECK(max_abs_diff(m2->get_parameter(k), t) == 0.0);
    CHECK(max_abs_diff(m2->forward(ids), ref) == 0.0);
  }
}

TEST_CASE("Llama: load errors name the directory and the key") {
  auto m = load_model_hf(kDebugDir);
  dtr::test::TempDir dir("llama_bad");
  auto sd = safetensors::load_file(std::string(kDebugDir) + "/model.safetensors");
  sd.erase("model.layers.1.mlp.up_proj.weight");
  std::filesystem::copy_file(std::string(kDebugDir) + "/config.json", dir.file("config.json"));
  safetensors::save_file(sd, dir.file("model.safetensors"));
  CHECK_THROWS_WITH(load_model_hf(dir.path.string()),
                    Catch::Contains(dir.path.string()) && Catch::Contains("model.layers.1.mlp.up_proj.weight"));
  sd = safetensors::load_file(std::string(kDebugDir) + "/model.safetensors");
  sd["model.norm.weight"] = zeros({63});
  safetensors::save_file(sd, dir.file("model.safetensors"));
  CHECK_THROWS_WITH(load_model_hf(dir.path.string()), Catch::Contains("model.norm.weight"));
  Tensor bad = from_vector(std::vector<float>{1, 2}, {1, 2});
  CHECK_THROWS_WITH(m->forward(bad), Catch::Contains("input_ids"));
}
