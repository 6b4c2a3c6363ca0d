// The real second model: Gemma 3 270M (Q4_K_M GGUF, data/gemma3-270m-q4_k_m.gguf, fetched by
// scripts/fetch-model.sh) loaded by dtr against transformers loading the same GGUF
// (tests/golden/gemma3_270m.json from tests/golden/make_gemma3_fixture.py): the top-20 logits
// and the logsumexp of every position of 4 prompts, the loss of a 2 x 12 batch, and greedy
// generation of 16 tokens (KV cache) token for token. Skips with a warning when the model file is
// absent.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/formats/gguf.h"
#include "models/transformer/load.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

using namespace dtr;

namespace {

const char* kModel = "data/gemma3-270m-q4_k_m.gguf";

// Both sides dequantise the same Q4_K / Q5_0 / Q6_K / Q8_0 blocks to the same f32 weights and take
// llama.cpp's + 1 off the norm weights in f32; what differs is f32 summation order through 18
// layers (GEMM blocking, online vs eager softmax, norm reductions) and the 262,144-way lm_head.
// Logits here are O(10-30); a wrong norm offset, RoPE base, window or attention scale moves them
// by whole units. Measured (printed by the test): max |top-20 logit diff| 9.9e-5, max |logsumexp
// diff| 6.8e-5 over every position of the 4 prompts; 1e-3 absolute leaves 10x margin for other
// thread counts and kernels. The loss (mean NLL of 22 targets) sits within the same noise.
constexpr double kLogitAbsTol = 1e-3;
constexpr double kLossAbsTol = 1e-4;

Tensor ids_tensor(const std::vector<int64_t>& ids) { return from_vector(ids, {1, static_cast<int64_t>(ids.size())}); }

}  // namespace

TEST_CASE("Gemma 3 270M GGUF matches transformers: logits of every position, loss, greedy generation", "[gemma3]") {
  if (!std::filesystem::exists(kModel)) {
    WARN("SKIP: " << kModel << " not found (run scripts/fetch-model.sh gemma3)");
    return;
  }
  std::ifstream in("tests/golden/gemma3_270m.json");
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  auto m = load_model_gguf(kModel);
  m->eval();
  const ModelConfig& c = m->config();
  CHECK(m->type_name() == "Gemma3ForCausalLM");
  CHECK(c.num_hidden_layers == 18);
  CHECK(c.hidden_size == 640);
  CHECK(c.head_dim == 256);
  CHECK(c.num_key_value_heads == 1);
  CHECK(c.vocab_size == 262144);
  CHECK(c.sliding_window == 512);
  CHECK(c.is_sliding(0));
  CHECK_FALSE(c.is_sliding(5));  // every 6th layer is global
  CHECK(m->tied());

  NoGradGuard ng;
  double worst = 0, worst_lse = 0;
  for (const auto& p : j["prompts"]) {
    INFO("prompt: " << p["text"].get<std::string>());
    const auto ids = p["input_ids"].get<std::vector<int64_t>>();
    const Tensor logits = m->forward(ids_tensor(ids));
    const int64_t T = static_cast<int64_t>(ids.size()), V = c.vocab_size;
    const auto all = logits.contiguous().to_vector<float>();
    for (int64_t t = 0; t < T; ++t) {
      const float* row = all.data() + t * V;
      const auto top_ids = p["top_ids"][t].get<std::vector<int64_t>>();
      const auto top_vals = p["top_logits"][t].get<std::vector<double>>();
      for (size_t i = 0; i < top_ids.size(); ++i) worst = std::max(worst, std::abs(row[top_ids[i]] - top_vals[i]));
      double mx = row[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(row[v] - mx);
      worst_lse = std::max(worst_lse, std::abs(mx + std::log(s) - p["logsumexp"][t].get<double>()));
    }
  }
  WARN("Gemma 3 270M vs transformers: max |top-20 logit diff| " << worst << ", max |logsumexp diff| " << worst_lse);
  CHECK(worst < kLogitAbsTol);
  CHECK(worst_lse < kLogitAbsTol);

  const auto b = j["loss_batch"];
  std::vector<int64_t> flat;
  for (const auto& row : b)
    for (const auto& x : row) flat.push_back(x.get<int64_t>());
  const Tensor batch = from_vector(flat, {static_cast<int64_t>(b.size()), static_cast<int64_t>(b[0].size())});
  const double loss = m->forward_loss(batch, batch).item<double>();
  CHECK(std::abs(loss - j["loss"].get<double>()) < kLossAbsTol);

  // Greedy generation with the KV cache: token for token.
  const auto gen = j["generate"];
  std::vector<int64_t> ids = gen["input_ids"].get<std::vector<int64_t>>();
  const auto want = gen["output_ids"].get<std::vector<int64_t>>();
  enable_kv_cache(*m, true);
  Tensor step = ids_tensor(ids);
  std::vector<int64_t> got;
  for (size_t k = 0; k < want.size(); ++k) {
    const Tensor lg = m->forward(step);
    const Tensor last = narrow(lg, 1, lg.size(1) - 1, 1).reshape({-1});
    const int64_t next = argmax(last, 0).item<int64_t>();
    got.push_back(next);
    step = ids_tensor({next});
  }
  enable_kv_cache(*m, false);
  CHECK(got == want);
}
