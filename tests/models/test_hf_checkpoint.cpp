// Hugging Face checkpoint directories: config.json + (sharded) safetensors round trip.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <random>

#include "models/formats/hf_checkpoint.h"
#include "models/test_util.h"

using namespace dtr;
using Catch::Matchers::Contains;

namespace {
LlamaConfig debug_config() {
  LlamaConfig c;
  c.vocab_size = 10;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}
Tensor rand_bf16(const Shape& s, uint32_t seed) {
  Tensor t = empty(s, TensorOptions(DType::bf16));
  std::mt19937 rng(seed);
  auto* p = static_cast<uint16_t*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint16_t>(rng());
  return t;
}
}  // namespace

TEST_CASE("HF checkpoint round trip (sharded, bf16, untied)", "[hf_checkpoint]") {
  HFCheckpoint ck;
  ck.config = debug_config();
  uint32_t seed = 0;
  auto add = [&](const std::string& n, const Shape& s) { ck.state_dict[n] = rand_bf16(s, seed++); };
  add("model.embed_tokens.weight", {10, 8});
  add("lm_head.weight", {10, 8});
  add("model.norm.weight", {8});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {8});
    add(p + "post_attention_layernorm.weight", {8});
    add(p + "self_attn.q_proj.weight", {8, 8});
    add(p + "self_attn.k_proj.weight", {4, 8});
    add(p + "self_attn.v_proj.weight", {4, 8});
    add(p + "self_attn.o_proj.weight", {8, 8});
    add(p + "mlp.gate_proj.weight", {16, 8});
    add(p + "mlp.up_proj.weight", {16, 8});
    add(p + "mlp.down_proj.weight", {8, 16});
  }
  test::TempDir dir("hf_ckpt");
  save_hf_checkpoint(ck, dir.path.string(), 600);
  CHECK(std::filesystem::exists(dir.file("config.json")));
  CHECK(std::filesystem::exists(dir.file("model.safetensors.index.json")));
  HFCheckpoint back = load_hf_checkpoint(dir.path.string());
  CHECK(to_json(back.config) == to_json(ck.config));
  REQUIRE(back.state_dict.size() == ck.state_dict.size());
  for (const auto& [n, t] : ck.state_dict) {
    INFO(n);
    const Tensor& b = back.state_dict.at(n);
    CHECK(b.dtype() == DType::bf16);
    CHECK(b.sizes() == t.sizes());
    CHECK(std::memcmp(b.data_ptr(), t.data_ptr(), t.nbytes()) == 0);
  }
  // tied: lm_head is not written
  ck.config.tie_word_embeddings = true;
  test::TempDir dir2("hf_ckpt_tied");
  save_hf_checkpoint(ck, dir2.path.string());
  CHECK(load_hf_checkpoint(dir2.path.string()).state_dict.count("lm_head.weight") == 0);
  // a shape that disagrees with config.json
  ck.state_dict["model.norm.weight"] = rand_bf16({7}, 99);
  test::TempDir dir3("hf_ckpt_bad");
  save_hf_checkpoint(ck, dir3.path.string());
  REQUIRE_THROWS_WITH(load_hf_checkpoint(dir3.path.string()),
                      Contains("'model.norm.weight'") && Contains("[7]") && Contains("[8]"));
}
