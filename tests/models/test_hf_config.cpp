// LlamaConfig from config.json and GGUF metadata, and back to config.json.
#include <catch2/catch.hpp>
#include <filesystem>

#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/hf_config.h"
#include "models/test_util.h"

using namespace dtr;
using Catch::Matchers::Contains;

namespace {
// SmolLM2-135M-Instruct's config.json (the keys that matter).
const char* kSmolConfig = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
  "num_attention_heads": 9, "num_key_value_heads": 3, "rope_theta": 100000,
  "rms_norm_eps": 1e-05, "vocab_size": 49152, "tie_word_embeddings": true,
  "max_position_embeddings": 8192, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
  "hidden_act": "silu", "torch_dtype": "bfloat16", "rope_scaling": null
})";
}  // namespace

TEST_CASE("LlamaConfig from config.json", "[hf_config]") {
  LlamaConfig c = model_config_from_json(nlohmann::json::parse(kSmolConfig), "config.json");
  CHECK(c.hidden_size == 576);
  CHECK(c.intermediate_size == 1536);
  CHECK(c.num_hidden_layers == 30);
  CHECK(c.num_attention_heads == 9);
  CHECK(c.num_key_value_heads == 3);
  CHECK(c.head_dim == 64);
  CHECK(c.rope_theta == 100000.0);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.vocab_size == 49152);
  CHECK(c.tie_word_embeddings);
  CHECK(c.max_position_embeddings == 8192);
  CHECK(c.bos_token_id == 1);
  CHECK(c.eos_token_id() == 2);
  CHECK(c.torch_dtype == "bfloat16");

  // to_json -> from_json round trip, through a file
  test::TempDir dir("hf_config");
  save_model_config(c, dir.file("config.json"));
  LlamaConfig d = load_model_config(dir.path.string());
  CHECK(to_json(d) == to_json(c));
}

TEST_CASE("config.json errors name the key and the file", "[hf_config][errors]") {
  auto j = nlohmann::json::parse(kSmolConfig);
  SECTION("missing required key") {
    j.erase("num_hidden_layers");
    REQUIRE_THROWS_WITH(model_config_from_json(j, "m/config.json"),
                        Contains("m/config.json") && Contains("'num_hidden_layers'"));
  }
  SECTION("wrong type") {
    j["hidden_size"] = "576";
    REQUIRE_THROWS_WITH(model_config_from_json(j, "x"), Contains("'hidden_size'") && Contains("integer"));
  }
  SECTION("kv heads do not divide heads") {
    j["num_key_value_heads"] = 4;
    REQUIRE_THROWS_WITH(model_config_from_json(j, "x"), Contains("num_key_value_heads = 4"));
  }
  SECTION("missing file") {
    REQUIRE_THROWS_WITH(load_model_config("/nonexistent/config.json"), Contains("/nonexistent/config.json"));
  }
  SECTION("bad JSON") {
    test::TempDir dir("hf_config_bad");
    test::write_bytes(dir.file("config.json"), "{\"a\": ");
    REQUIRE_THROWS_WITH(load_model_config(dir.file("config.json")), Contains("JSON error"));
  }
}

TEST_CASE("LlamaConfig from GGUF metadata", "[hf_config][gguf]") {
  using namespace dtr::gguf;
  GGUFWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.embedding_length", 64);
  w.add_u32("llama.feed_forward_length", 160);
  w.add_u32("llama.block_count", 2);
  w.add_u32("llama.attention.head_count", 4);
  w.add_u32("llama.attention.head_count_kv", 2);
  w.add_f32("llama.rope.freq_base", 500000.0f);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32("llama.context_length", 256);
  w.add("tokenizer.ggml.tokens", make_string_array({"a", "b", "c"}));
  w.add_u32("tokenizer.ggml.bos_token_id", 0);
  w.add_u32("tokenizer.ggml.eos_token_id", 1);
  test::TempDir dir("hf_config_gguf");
  w.write(dir.file("m.gguf"));
  LlamaConfig c = model_config_from_gguf(GGUFFile::open(dir.file("m.gguf")));
  CHECK(c.hidden_size == 64);
  CHECK(c.intermediate_size == 160);
  CHECK(c.num_hidden_layers == 2);
  CHECK(c.num_attention_heads == 4);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.head_dim == 16);
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rms_norm_eps == Approx(1e-5));
  CHECK(c.vocab_size == 3);
  CHECK(c.tie_word_embeddings);  // no output.weight tensor
  CHECK(c.max_position_embeddings == 256);
  CHECK(c.bos_token_id == 0);
  CHECK(c.eos_token_id() == 1);

  GGUFWriter w2;
  w2.add_string("general.architecture", "llama");
  w2.add_u32("llama.embedding_length", 64);
  w2.write(dir.file("bad.gguf"));
  REQUIRE_THROWS_WITH(model_config_from_gguf(GGUFFile::open(dir.file("bad.gguf"))),
                      Contains("bad.gguf") && Contains("llama.feed_forward_length"));
}

TEST_CASE("real SmolLM2 GGUF config", "[hf_config][real]") {
  const char* path = "data/smollm2-135m-instruct.gguf";
  if (!std::filesystem::exists(path)) {
    WARN("SKIP: " << path << " is absent (run scripts/fetch-model.sh)");
    return;
  }
  LlamaConfig c = model_config_from_gguf(gguf::GGUFFile::open(path));
  LlamaConfig ref = model_config_from_json(nlohmann::json::parse(kSmolConfig), "ref");
  CHECK(c.hidden_size == ref.hidden_size);
  CHECK(c.intermediate_size == ref.intermediate_size);
  CHECK(c.num_hidden_layers == ref.num_hidden_layers);
  CHECK(c.num_attention_heads == ref.num_attention_heads);
  CHECK(c.num_key_value_heads == ref.num_key_value_heads);
  CHECK(c.head_dim == ref.head_dim);
  CHECK(c.rope_theta == ref.rope_theta);
  CHECK(c.rms_norm_eps == Approx(ref.rms_norm_eps));
  CHECK(c.vocab_size == ref.vocab_size);
  CHECK(c.tie_word_embeddings == ref.tie_word_embeddings);
  CHECK(c.max_position_embeddings == ref.max_position_embeddings);
  CHECK(c.bos_token_id == ref.bos_token_id);
  CHECK(c.eos_token_id() == ref.eos_token_id());
}

TEST_CASE("transformers 5 config.json: rope_theta under rope_parameters", "[hf_config]") {
  nlohmann::json j = nlohmann::json::parse(
      R"({"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
          "vocab_size": 128, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}})");
  CHECK(model_config_from_json(j, "config.json").rope_theta == 100000.0);
}
