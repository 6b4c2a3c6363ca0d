// Qwen3-MoE GGUF (llama.cpp's qwen3moe) against transformers' GGUF loader: the tiny random model
// of tests/golden/make_qwen3_moe_gguf_fixture.py written by the gguf package in llama.cpp's
// layout (3-d ffn_{gate,up,down}_exps, ffn_gate_inp router; layer 0's experts Q8_0 / Q4_0) and
// its transformers logits (tests/golden/qwen3_moe_gguf.json); dtr's own writer (HF -> GGUF ->
// dtr); the meta load; bad files (missing expert tensor, wrong expert_count);
// Mixtral's GGUF refused.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gradcheck.h"
#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/hf_config.h"
#include "models/transformer/causal_lm.h"
#include "models/transformer/convert.h"
#include "models/transformer/gguf_names.h"
#include "models/transformer/load.h"
#include "models/transformer/meta_load.h"
#include "parallel/meta_init.h"
#include "tensor/nn/moe.h"

using namespace dtr;
using dtr::testing::max_abs_diff;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {
/// f32 both sides (transformers dequantises Q8_0 / Q4_0 to the same f32 values as dtr): products
/// and softmaxes summed in other orders, ~1e-7 on logits ~0.5.
constexpr double kLogitTol = 1e-5;
const std::string kDir = "tests/golden/qwen3_moe_gguf";
const std::string kGGUF = kDir + "/qwen3_moe_debug.gguf";

const json& fixture() {
  static const json j = [] {
    std::ifstream f("tests/golden/qwen3_moe_gguf.json");  // ctest runs from the source root
    REQUIRE(f.good());
    return json::parse(f);
  }();
  return j;
}

double logit_diff(CausalLM& m, const char* key) {
  m.eval();
  const json& c = fixture();
  const Tensor ids = from_vector<int64_t>(c["ids"].get<std::vector<int64_t>>(), c["shape"].get<Shape>());
  const Tensor logits = m.call(ids);
  const Tensor ref = from_vector<double>(c[key].get<std::vector<double>>(), logits.sizes());
  return max_abs_diff(to_dtype(logits, DType::f64), ref);
}

std::string scratch(const std::string& name) { return (fs::temp_directory_path() / ("dtr_moe_gguf_" + name)).string(); }

/// The fixture GGUF's tensors (raw bytes, any type) under the metadata of `c`, without `skip`.
void rewrite(const ModelConfig& c, const std::string& skip, const std::string& out) {
  const auto g = gguf::GGUFFile::open(kGGUF);
  gguf::GGUFWriter w;
  model_config_to_gguf(c, w);
  for (const auto& ti : g.tensors())
    if (ti.name != skip) w.add_tensor(ti.name, ti.ne, ti.type, std::string(g.raw(ti.name)));
  w.write(out);
}
}  // namespace

TEST_CASE("a qwen3moe GGUF in llama.cpp's layout gives transformers' GGUF-load logits", "[moe][gguf][golden]") {
  auto m = load_model_gguf(kGGUF);
  const ModelConfig& c = m->config();
  CHECK(m->type_name() == "Qwen3MoeForCausalLM");
  CHECK(c.num_experts == 4);
  CHECK(c.num_experts_per_tok == 2);
  CHECK(c.moe_intermediate_size == 32);
  CHECK(c.head_dim == 8);
  CHECK(c.norm_topk_prob);
  CHECK(nn::moe_modules(*m).size() == 2u);
  // Quantised experts (layer 0: gate / up Q8_0, down Q4_0) dequantised as gguf-py does.
  const double d = logit_diff(*m, "gguf_logits");
  CHECK(d < kLogitTol);
  // ... and they are not the f32 weights: the quantisation shows in the logits.
  CHECK(logit_diff(*m, "hf_logits") > 1e-4);
}

TEST_CASE("a meta-loaded qwen3moe GGUF gives the same logits", "[moe][gguf][meta]") {
  // Its blocks (experts, quantised rows) against the eager load: mpi_test_meta_init.cpp.
  auto m = load_model_meta(kGGUF);
  CHECK(has_meta_tensors(*m));
  materialize_module(*m);
  CHECK(logit_diff(*m, "gguf_logits") < kLogitTol);
}

TEST_CASE("dtr's GGUF writer: a Qwen3-MoE round-trips HF -> GGUF -> dtr in llama.cpp's layout", "[moe][gguf]") {
  auto hf = load_model_hf(kDir);
  CHECK(logit_diff(*hf, "hf_logits") < kLogitTol);
  const std::string out = scratch("roundtrip.gguf");
  {
    gguf::GGUFWriter w;
    model_config_to_gguf(hf->config(), w);
    add_gguf_model_tensors(w, hf->config(), model_export_state_dict(*hf), GGUFOutType::f32, kDir);
    w.write(out);
  }
  const auto mine = gguf::GGUFFile::open(out), theirs = gguf::GGUFFile::open(kGGUF);
  // The same tensors, dims and (f32 in both) bytes as the gguf package's llama.cpp layout.
  REQUIRE(mine.tensors().size() == theirs.tensors().size());
  for (const auto& ti : theirs.tensors()) {
    INFO(ti.name);
    REQUIRE(mine.has_tensor(ti.name));
    CHECK(mine.tensor_info(ti.name).ne == ti.ne);
    if (ti.type == static_cast<uint32_t>(gguf::GGMLType::F32)) CHECK(mine.raw(ti.name) == theirs.raw(ti.name));
  }
  for (const char* k : {"expert_count", "expert_used_count", "expert_feed_forward_length", "attention.key_length",
                        "feed_forward_length", "block_count", "attention.head_count_kv"})
    CHECK(mine.get_int(std::string("qwen3moe.") + k, -1) == theirs.get_int(std::string("qwen3moe.") + k, -2));
  CHECK(mine.get_string("general.architecture", "") == "qwen3moe");
  auto back = load_model_gguf(out);
  const auto a = hf->state_dict(), b = back->state_dict();
  REQUIRE(a.size() == b.size());
  for (const auto& [k, t] : a) {
    INFO(k);
    CHECK(max_abs_diff(t, b.at(k)) == 0.0);
  }
  CHECK(logit_diff(*back, "hf_logits") < kLogitTol);
  fs::remove(out);
}

TEST_CASE("bad qwen3moe GGUFs name the expert tensor and the shape expected", "[moe][gguf][bad_input]") {
  const ModelConfig c = model_config_from_gguf(gguf::GGUFFile::open(kGGUF));
  const std::string missing = scratch("missing.gguf"), count = scratch("count.gguf"), width = scratch("width.gguf");
  rewrite(c, "blk.1.ffn_up_exps.weight", missing);
  ModelConfig c5 = c;
  c5.num_experts = 5;
  rewrite(c5, "", count);
  ModelConfig cw = c;
  cw.moe_intermediate_size = 16;
  rewrite(cw, "", width);
  for (auto* load : {+[](const std::string& p) { return load_model_gguf(p); },
                     +[](const std::string& p) { return load_model_meta(p); }}) {
    CHECK_THROWS_WITH(load(missing), Catch::Contains("missing tensor 'blk.1.ffn_up_exps.weight'") &&
                                         Catch::Contains("model.layers.1.mlp.experts.gate_up_proj, part 2 of 2") &&
                                         Catch::Contains("expected shape [4, 32, 32]"));
    CHECK_THROWS_WITH(load(count), Catch::Contains("tensor 'blk.0.ffn_gate_inp.weight'") &&
                                       Catch::Contains("has shape [4, 32] but the config needs [5, 32]") &&
                                       Catch::Contains("qwen3moe.expert_count = 5"));
    CHECK_THROWS_WITH(load(width), Catch::Contains("tensor 'blk.0.ffn_gate_exps.weight'") &&
                                       Catch::Contains("has shape [4, 32, 32] but the config needs [4, 16, 32]") &&
                                       Catch::Contains("qwen3moe.expert_feed_forward_length = 16"));
  }
  for (const auto& p : {missing, count, width}) fs::remove(p);
}

TEST_CASE("MoE GGUF forms llama.cpp and transformers do not read are refused", "[moe][gguf][bad_input]") {
  gguf::GGUFWriter w;
  // Qwen3-MoE with a dense layer (mlp_only_layers): llama.cpp's qwen3moe makes every layer MoE.
  CHECK_THROWS_WITH(model_config_to_gguf(load_model_config("tests/golden/qwen3_moe_debug"), w),
                    Catch::Contains("mlp_only_layers = [1]") && Catch::Contains("not representable"));
  // Mixtral: llama.cpp writes it as llama + llama.expert_count; transformers' loader reads no experts.
  ModelConfig mx = load_model_config("tests/golden/mixtral_debug");
  gguf::GGUFWriter w2;
  CHECK_THROWS_WITH(model_config_to_gguf(mx, w2), Catch::Contains("Mixtral GGUF") && Catch::Contains("transformers"));
  mx.model_type = "llama";
  gguf::GGUFWriter w3;
  model_config_to_gguf(mx, w3);
  w3.add_u32("llama.expert_count", 4);
  const std::string p = scratch("mixtral.gguf");
  w3.write(p);
  CHECK_THROWS_WITH(model_config_from_gguf(gguf::GGUFFile::open(p)),
                    Catch::Contains("mixtral.gguf: Mixtral GGUF (general.architecture llama with llama.expert_count > 0) "
                                    "is not built"));
  fs::remove(p);
}
