// The model families beside Llama (Qwen2, Qwen3, Mistral, Gemma 3) against Hugging Face
// transformers: tiny random models built by tests/golden/make_families_fixture.py (one per
// family, each exercising what the family adds: q/k/v bias, q/k norm, head_dim != hidden / heads,
// sliding windows shorter than the batch, Gemma's (1 + w) norms, four norms per layer, embedding
// scale, local / global RoPE bases, query_pre_attn_scalar, final logit soft-capping, 1 kv head,
// tied embeddings). Logits, loss and gradients equal transformers'; the same weights through
// dtr's GGUF writer and reader give the same logits; config.json dispatch and bad input.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/safetensors.h"
#include "models/transformer/convert.h"
#include "models/transformer/family.h"
#include "models/transformer/flops.h"
#include "models/transformer/gguf_names.h"
#include "models/transformer/load.h"
#include "test_util.h"
#include "gradcheck.h"

using namespace dtr;
using Catch::Matchers::Contains;
using dtr::testing::max_abs_diff;

namespace {

// f32 against transformers (eager attention) on the same f32 weights: only the summation order
// differs (GEMM blocking, flash-style online softmax vs a softmax of the full scores); measured
// max |logit diff| <= 3e-7 over the four families. 1e-5 leaves margin for other kernels.
constexpr double kLogitTol = 1e-5;
constexpr double kLossRelTol = 1e-6;
// Gradients go through one more pass of f32 sums; compared relatively (norms) or against the
// largest element (the full gradient of one norm weight).
constexpr double kGradRelTol = 1e-5;

struct Family {
  const char* name;  // key in families_debug.json, directory tests/golden/<name>_debug
  const char* cls;   // HF class (the root module's type name)
};
const Family kFamilies[] = {
    {"qwen2", "Qwen2ForCausalLM"},
    {"qwen3", "Qwen3ForCausalLM"},
    {"mistral", "MistralForCausalLM"},
    {"gemma3", "Gemma3ForCausalLM"},
};

std::string dir_of(const Family& f) { return std::string("tests/golden/") + f.name + "_debug"; }

nlohmann::json fixture(const Family& f) {
  std::ifstream in("tests/golden/families_debug.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in)[f.name];
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

/// Logits of the fixture batch vs transformers'; returns the logits.
Tensor check_logits(CausalLM& m, const nlohmann::json& j) {
  const Tensor logits = m.forward(ids_tensor(j["input_ids"]));
  REQUIRE(logits.sizes() == j["logits_shape"].get<std::vector<int64_t>>());
  const Tensor ref = from_vector(j["logits"].get<std::vector<float>>(), logits.sizes());
  const double d = max_abs_diff(logits, ref);
  INFO("max |logits - transformers| = " << d);
  CHECK(d < kLogitTol);
  return logits;
}

/// The GGUF of `m`'s weights (dtr's writer: config metadata + tensors, no tokenizer) at `path`.
void write_gguf(CausalLM& m, const std::string& path) {
  gguf::GGUFWriter w;
  model_config_to_gguf(m.config(), w);
  add_gguf_model_tensors(w, m.config(), model_export_state_dict(m), GGUFOutType::f32, "test");
  w.write(path);
}

}  // namespace

TEST_CASE("families: config.json selects the family; unknown model_type lists the supported ones", "[families]") {
  for (const auto& f : kFamilies) {
    INFO(f.name);
    const ModelConfig c = load_model_config(dir_of(f));
    CHECK(model_family(c.model_type).class_prefix + "ForCausalLM" == f.cls);
    // config.json -> ModelConfig -> config.json -> ModelConfig is a fixed point.
    CHECK(to_json(model_config_from_json(to_json(c), "re-import")) == to_json(c));
  }
  const ModelConfig q2 = load_model_config("tests/golden/qwen2_debug");
  CHECK(q2.qkv_bias);
  CHECK_FALSE(q2.o_bias);
  CHECK(q2.layer_types == std::vector<std::string>{"full_attention", "sliding_attention", "sliding_attention"});
  const ModelConfig g = load_model_config("tests/golden/gemma3_debug");
  CHECK(g.head_dim == 32);
  CHECK(g.rope_theta == 1e6);
  CHECK(g.rope_local_base_freq == 1e4);
  CHECK(g.query_pre_attn_scalar == 24);
  CHECK(g.norm_offset);
  CHECK(g.tie_word_embeddings);
  // transformers 5 rejects a float query_pre_attn_scalar (24.0) when it loads the export.
  CHECK(to_json(g)["query_pre_attn_scalar"].is_number_integer());
  nlohmann::json j = to_json(q2);
  j["model_type"] = "gpt_neox";
  CHECK_THROWS_WITH(model_config_from_json(j, "m/config.json"),
                    Contains("m/config.json") && Contains("model_type 'gpt_neox' is not supported") &&
                        Contains("gemma3_text, llama, mistral, mixtral, qwen2, qwen3, qwen3_moe"));
  j["model_type"] = "gemma3_text";
  j["attn_logit_softcapping"] = 50.0;
  CHECK_THROWS_WITH(model_config_from_json(j, "x"), Contains("attn_logit_softcapping") && Contains("not supported"));
}

TEST_CASE("families: logits, loss and gradients equal transformers'", "[families]") {
  for (const auto& f : kFamilies) {
    INFO(f.name);
    const auto j = fixture(f);
    auto m = load_model_hf(dir_of(f));
    m->eval();
    CHECK(m->type_name() == f.cls);
    // Exactly the keys transformers saved (lm_head omitted when tied).
    auto file = safetensors::SafetensorsFile::open(dir_of(f) + "/model.safetensors");
    std::vector<std::string> fkeys = file.keys(), keys;
    for (auto& [k, t] : model_export_state_dict(*m)) keys.push_back(k);
    std::sort(fkeys.begin(), fkeys.end());
    CHECK(keys == fkeys);
    check_logits(*m, j);
    const Tensor ids = ids_tensor(j["input_ids"]);
    const Tensor labels = ids_tensor(j["labels"]);
    Tensor loss = m->forward_loss(ids, labels);
    CHECK(loss.item<double>() == Approx(j["loss"].get<double>()).epsilon(kLossRelTol));
    loss.backward();
    int compared = 0;
    for (auto& [n, p] : m->named_parameters()) {
      INFO(n);
      REQUIRE(j["grad_norms"].contains(n));
      REQUIRE(p.grad().defined());
      CHECK(norm(p.grad()) == Approx(j["grad_norms"][n].get<double>()).epsilon(kGradRelTol));
      ++compared;
    }
    CHECK(compared == static_cast<int>(j["grad_norms"].size()));
    const std::string nn = j["norm_grad_name"].get<std::string>();
    const Tensor ref = from_vector(j["norm_grad"].get<std::vector<double>>(), {static_cast<int64_t>(j["norm_grad"].size())});
    const Tensor got = m->get_parameter(nn).grad().to(DType::f64);
    CHECK(max_abs_diff(got, ref) <= kGradRelTol * amax(abs(ref)).item<double>());
  }
}

TEST_CASE("families: the same weights through dtr's GGUF writer and reader", "[families][gguf]") {
  dtr::test::TempDir tmp("families_gguf");
  for (const auto& f : kFamilies) {
    INFO(f.name);
    auto m = load_model_hf(dir_of(f));
    const std::string path = tmp.file(std::string(f.name) + ".gguf");
    write_gguf(*m, path);
    const auto g = gguf::GGUFFile::open(path);
    const std::string arch = g.get_string("general.architecture", "");
    CHECK(arch == model_family(m->config().model_type).gguf_architecture);
    auto back = load_model_gguf(path);
    CHECK(back->type_name() == f.cls);
    const ModelConfig &a = m->config(), &b = back->config();
    CHECK(b.layer_types == a.layer_types);
    CHECK(b.sliding_window == a.sliding_window);
    CHECK(b.head_dim == a.head_dim);
    CHECK(b.num_key_value_heads == a.num_key_value_heads);
    CHECK(b.qkv_bias == a.qkv_bias);
    CHECK(b.qk_norm == a.qk_norm);
    CHECK(b.query_pre_attn_scalar == a.query_pre_attn_scalar);
    CHECK(b.final_logit_softcapping == a.final_logit_softcapping);
    CHECK(b.tie_word_embeddings == a.tie_word_embeddings);
    // Tensors: bit for bit, except Gemma's norms (stored as 1 + w in f32, so w comes back rounded).
    auto sa = model_export_state_dict(*m), sb = model_export_state_dict(*back);
    REQUIRE(sa.size() == sb.size());
    for (auto& [n, t] : sa) {
      INFO(n);
      REQUIRE(sb.count(n));
      const double d = max_abs_diff(t, sb.at(n));
      if (gguf_value_shift(n, a) != 0) CHECK(d <= 1.2e-7);  // half an ulp of values near 1
      else CHECK(d == 0.0);
    }
    check_logits(*back, fixture(f));
  }
}

TEST_CASE("families: a wrong shape or a missing tensor names the tensor and the expected shape", "[families]") {
  dtr::test::TempDir tmp("families_bad");
  auto m = load_model_hf("tests/golden/qwen3_debug");
  auto sd = model_export_state_dict(*m);
  save_model_config(m->config(), tmp.file("config.json"));
  auto bad = sd;
  bad["model.layers.1.self_attn.k_norm.weight"] = zeros({16});
  safetensors::save_file(bad, tmp.file("model.safetensors"));
  CHECK_THROWS_WITH(load_model_hf(tmp.path.string()),
                    Contains("model.layers.1.self_attn.k_norm.weight") && Contains("[24]") && Contains("[16]"));
  bad = sd;
  bad.erase("model.layers.0.self_attn.q_norm.weight");
  safetensors::save_file(bad, tmp.file("model.safetensors"));
  CHECK_THROWS_WITH(load_model_hf(tmp.path.string()), Contains("model.layers.0.self_attn.q_norm.weight"));
  // GGUF: a missing tensor is named by both names, a wrong shape with the config's shape.
  gguf::GGUFWriter w;
  model_config_to_gguf(m->config(), w);
  bad = sd;
  bad.erase("model.layers.1.self_attn.k_norm.weight");
  CHECK_THROWS_WITH(add_gguf_model_tensors(w, m->config(), bad, GGUFOutType::f32, "dir"),
                    Contains("missing tensor 'model.layers.1.self_attn.k_norm.weight'"));
  gguf::GGUFWriter w2;
  model_config_to_gguf(m->config(), w2);
  for (auto& [n, t] : sd) {
    const std::string gn = hf_to_gguf_name(n, "qwen3");
    if (n == "model.layers.1.self_attn.k_norm.weight") continue;
    w2.add_f32_tensor(gn, t.sizes(), t.contiguous().to_vector<float>());
  }
  w2.write(tmp.file("m.gguf"));
  CHECK_THROWS_WITH(load_model_gguf(tmp.file("m.gguf")),
                    Contains("missing tensor 'blk.1.attn_k_norm.weight'") &&
                        Contains("model.layers.1.self_attn.k_norm.weight"));
  gguf::GGUFWriter w3;
  model_config_to_gguf(m->config(), w3);
  for (auto& [n, t] : sd) {
    const bool wrong = n == "model.layers.0.self_attn.q_proj.weight";
    w3.add_f32_tensor(hf_to_gguf_name(n, "qwen3"), wrong ? Shape{95, 64} : t.sizes(),
                      wrong ? std::vector<float>(95 * 64) : t.contiguous().to_vector<float>());
  }
  w3.write(tmp.file("m3.gguf"));
  CHECK_THROWS_WITH(load_model_gguf(tmp.file("m3.gguf")),
                    Contains("blk.0.attn_q.weight") && Contains("[95, 64]") && Contains("[96, 64]"));
}

TEST_CASE("families: training FLOPs count head_dim, the gated MLP and the sliding window as computed", "[families]") {
  // llama_train_flops_per_token (dtr-train's MFU, dtr-bench train-step, bench/compare's
  // torch_family_lora.model_flops) on the Gemma 3 debug config: head_dim 32 != hidden 64 / 4
  // heads, GeGLU, layers sliding (window 5) / full / sliding, tied lm_head. Matmul weights from
  // the model's own parameters; attention 12 x heads x head_dim x keys, keys = seq on the full
  // layer and min(seq, window) on the sliding ones (the band the kernel computes). Before, every
  // layer counted seq keys: 12 x 4 x 32 x 3 x 16 instead of x (5 + 16 + 5).
  auto m = load_model_hf("tests/golden/gemma3_debug");
  const ModelConfig& c = m->config();
  REQUIRE(c.sliding_window == 5);
  REQUIRE(llama_head_dim(c) * c.num_attention_heads != c.hidden_size);
  double weights = static_cast<double>(c.hidden_size * c.vocab_size);  // tied lm_head
  for (const auto& [n, p] : m->named_parameters())
    if (p.dim() == 2 && n.find("embed_tokens") == std::string::npos) weights += static_cast<double>(p.numel());
  CHECK(llama_matmul_weights(c) == weights);
  const double seq = 16, attention = 12.0 * 4 * 32 * (5 + 16 + 5);
  CHECK(llama_train_flops_per_token(c, false, 0, seq) == Approx(6 * weights + attention).epsilon(1e-12));
  CHECK(llama_train_flops_per_token(c, true, 1000, seq) == Approx(4 * weights + 6000 + attention).epsilon(1e-12));
  // seq 4 < window: every layer counts seq keys.
  CHECK(llama_train_flops_per_token(c, false, 0, 4) == Approx(6 * weights + 12.0 * 4 * 32 * 12).epsilon(1e-12));
}
