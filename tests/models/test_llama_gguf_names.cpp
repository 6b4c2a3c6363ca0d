// GGUF <-> Hugging Face Llama tensor names, and the real SmolLM2 GGUF as an HF state dict.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "models/transformer/gguf_names.h"
#include "models/test_util.h"

using namespace dtr;
using Catch::Matchers::Contains;

TEST_CASE("GGUF and HF Llama names map both ways", "[gguf][names]") {
  const std::pair<const char*, const char*> pairs[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"},
      {"blk.12.attn_k.weight", "model.layers.12.self_attn.k_proj.weight"},
      {"blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"},
      {"blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"},
      {"blk.29.ffn_gate.weight", "model.layers.29.mlp.gate_proj.weight"},
      {"blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"},
      {"blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"},
      {"blk.7.attn_norm.weight", "model.layers.7.input_layernorm.weight"},
      {"blk.7.ffn_norm.weight", "model.layers.7.post_attention_layernorm.weight"},
  };
  for (const auto& [g, h] : pairs) {
    CHECK(gguf_to_hf_name(g) == h);
    CHECK(hf_to_gguf_name(h) == g);
  }
  CHECK(gguf_to_hf_name("rope_freqs.weight").empty());
  CHECK(gguf_to_hf_name("blk.x.attn_q.weight").empty());
  CHECK(hf_to_gguf_name("model.layers.1.self_attn.lora_A.weight").empty());
  LlamaConfig c;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  CHECK(qk_permute_heads("model.layers.0.self_attn.q_proj.weight", c) == 9);
  CHECK(qk_permute_heads("model.layers.0.self_attn.k_proj.weight", c) == 3);
  CHECK(qk_permute_heads("model.layers.0.self_attn.v_proj.weight", c) == 0);
}

TEST_CASE("real SmolLM2 GGUF loads as an HF state dict", "[gguf][names][real]") {
  const char* path = "data/smollm2-135m-instruct.gguf";
  if (!std::filesystem::exists(path)) {
    WARN("SKIP: " << path << " is absent (run scripts/fetch-model.sh)");
    return;
  }
  const gguf::GGUFFile g = gguf::GGUFFile::open(path);
  const LlamaConfig c = model_config_from_gguf(g);
  const auto sd = load_gguf_state_dict(g, c);
  CHECK(sd.size() == 2 + 9 * 30);  // embed + norm + 9 per layer, lm_head tied
  CHECK(sd.count("lm_head.weight") == 0);
  CHECK(sd.at("model.layers.0.self_attn.q_proj.weight").sizes() == Shape{576, 576});
  CHECK(sd.at("model.layers.0.self_attn.k_proj.weight").sizes() == Shape{192, 576});
  CHECK(sd.at("model.layers.0.mlp.down_proj.weight").sizes() == Shape{576, 1536});
  CHECK(sd.at("model.embed_tokens.weight").dtype() == DType::f32);
  // q/k in HF order: compare with gguf-py + transformers' reverse permutation (fixture)
  const auto fx = nlohmann::json::parse(test::read_bytes("tests/golden/gguf_dequant.json"));
  for (const auto& e : fx["tensors"]) {
    if (!e.contains("hf_order")) continue;
    const Tensor& t = sd.at(gguf_to_hf_name(e["name"]));
    const float* p = t.data<float>();
    for (auto it = e["hf_order"]["samples"].begin(); it != e["hf_order"]["samples"].end(); ++it)
      CHECK(p[std::stoul(it.key())] == it.value().get<float>());
  }
}
