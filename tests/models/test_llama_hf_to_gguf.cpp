// dtr-convert hf-to-gguf: an HF directory -> GGUF -> HF is bit-exact in f32 (random debug model,
// sharded input, tied and untied embeddings); f16 / bf16 output rounds 2-D weights only; the
// GGUF holds llama.cpp's names, metadata and Q/K row order. On the real model:
// GGUF (dequantised) -> HF -> GGUF (f32) loads to the same tensors, config and token ids.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

#include "models/formats/gguf.h"
#include "models/formats/hf_config.h"
#include "models/transformer/gguf_names.h"
#include "models/formats/qk_permute.h"
#include "models/formats/sharded_checkpoint.h"
#include "models/transformer/convert.h"
#include "models/transformer/load.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "models/tokenizer/byte_level.h"
#include "tensor/random.h"

using namespace dtr;
namespace fs = std::filesystem;

namespace {

struct TmpDir {
  fs::path path;
  explicit TmpDir(const std::string& tag) : path(fs::temp_directory_path() / ("dtr_h2g_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

// 256 byte tokens + 5 merges + <|im_start|> (bos) + <|im_end|> (eos) = 263 tokens; SmolLM2's
// pre-tokenizer (digits one by one, then GPT-2).
tokenizer::BPEVocab debug_vocab() {
  tokenizer::BPEVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(tokenizer::bytes_to_unicode(std::string(1, static_cast<char>(b))));
  v.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}};
  for (const auto& [a, b] : v.merges) v.tokens.push_back(a + b);
  v.tokens.push_back("<|im_start|>");
  v.tokens.push_back("<|im_end|>");
  v.types.assign(v.tokens.size(), tokenizer::TokenType::normal);
  v.types[261] = v.types[262] = tokenizer::TokenType::control;
  v.bos_id = 261;
  v.eos_id = 262;
  v.pre_patterns = {R"(\p{N})", tokenizer::kGpt2Pattern};
  return v;
}

const char* const kChatTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}";

const std::vector<std::string> kTexts = {"hello world", "Hello 12345 wörld!\n\n  x", "<|im_start|>user\nhi<|im_end|>",
                                         "def f(x):\n    return x ** 2  # 世界"};

// A random debug Llama as an HF directory (sharded when max_shard_bytes is small).
LlamaConfig write_debug_hf(const std::string& dir, bool tied, uint64_t max_shard_bytes) {
  LlamaConfig c = llama_debug_config();
  c.vocab_size = 263;
  c.bos_token_id = 261;
  c.eos_token_ids = {262};
  c.tie_word_embeddings = tied;
  manual_seed(tied ? 11 : 12);
  LlamaForCausalLM model(c);
  save_model_hf(model, dir, max_shard_bytes);
  tokenizer::save_hf_tokenizer(tokenizer::BPETokenizer(debug_vocab()), dir, kChatTemplate);
  return c;
}

// GGUF stores rms_norm_eps and rope_theta as float32 (llama.cpp does too): a config read from a
// GGUF equals the HF one with those two rounded to f32.
void check_same_config(const LlamaConfig& hf, const LlamaConfig& from_gguf) {
  CHECK(static_cast<float>(hf.rms_norm_eps) == static_cast<float>(from_gguf.rms_norm_eps));
  CHECK(static_cast<float>(hf.rope_theta) == static_cast<float>(from_gguf.rope_theta));
  auto a = to_json(hf), b = to_json(from_gguf);
  for (auto* j : {&a, &b}) {
    j->erase("rms_norm_eps");
    j->erase("rope_theta");
  }
  CHECK(a == b);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.numel()) * itemsize(x.dtype())) == 0;
}

void check_same_tokenizer(const tokenizer::BPETokenizer& a, const tokenizer::BPETokenizer& b) {
  for (const auto& t : kTexts) CHECK(a.encode(t) == b.encode(t));
  CHECK(a.bos_id() == b.bos_id());
  CHECK(a.eos_id() == b.eos_id());
  CHECK(a.pad_id() == b.pad_id());
  CHECK(a.vocab().tokens == b.vocab().tokens);
}

}  // namespace

TEST_CASE("hf-to-gguf: metadata, names, types and Q/K order of the written GGUF", "[convert][hf_to_gguf]") {
  TmpDir t("meta");
  const LlamaConfig c = write_debug_hf(t / "hf", /*tied=*/false, safetensors::kDefaultMaxShardBytes);
  convert_hf_to_gguf(t / "hf", t / "m.gguf");
  const auto g = gguf::GGUFFile::open(t / "m.gguf");
  CHECK(g.get_string("general.architecture", "") == "llama");
  CHECK(g.get_int("general.file_type", -1) == 0);
  CHECK(g.get_int("llama.block_count", 0) == c.num_hidden_layers);
  CHECK(g.get_int("llama.embedding_length", 0) == c.hidden_size);
  CHECK(g.get_int("llama.attention.head_count_kv", 0) == c.num_key_value_heads);
  CHECK(g.get_int("llama.rope.dimension_count", 0) == c.head_dim);
  CHECK(g.get_string("tokenizer.ggml.model", "") == "gpt2");
  CHECK(g.get_string("tokenizer.ggml.pre", "") == "smollm");
  CHECK(g.get("tokenizer.ggml.tokens").as_array().size() == 263);
  CHECK(g.get("tokenizer.ggml.merges").as_string_array().front() == "h e");
  CHECK(g.get_int("tokenizer.ggml.bos_token_id", -1) == 261);
  CHECK(g.get_int("tokenizer.ggml.eos_token_id", -1) == 262);
  CHECK(g.get_string("tokenizer.chat_template", "") == kChatTemplate);
  check_same_config(c, model_config_from_gguf(g));
  // 9 tensors per layer + token_embd + output_norm + output, all F32.
  CHECK(g.tensors().size() == 9 * 2 + 3);
  for (const auto& ti : g.tensors()) CHECK(ti.type == static_cast<uint32_t>(gguf::GGMLType::F32));
  CHECK(g.tensors().front().name == "token_embd.weight");
  // q / k rows are in llama.cpp's order.
  const auto hf = safetensors::load_checkpoint(t / "hf");
  for (const auto& [hf_name, heads] : {std::pair{"model.layers.1.self_attn.q_proj.weight", c.num_attention_heads},
                                       {"model.layers.1.self_attn.k_proj.weight", c.num_key_value_heads}}) {
    const Tensor want = permute_qk(hf.at(hf_name), heads);
    CHECK(bit_equal(g.load_f32(hf_to_gguf_name(hf_name)), want));
  }
}

TEST_CASE("hf-to-gguf: HF -> GGUF (f32) -> HF is bit-exact", "[convert][hf_to_gguf]") {
  for (bool tied : {false, true}) {
    INFO("tied embeddings: " << tied);
    TmpDir t(tied ? "rt_tied" : "rt");
    // Sharded input (about 4 shards) exercises the index path.
    write_debug_hf(t / "hf", tied, /*max_shard_bytes=*/60'000);
    REQUIRE(fs::exists(t / "hf/model.safetensors.index.json"));
    convert_hf_to_gguf(t / "hf", t / "m.gguf", GGUFOutType::f32);
    CHECK(gguf::GGUFFile::open(t / "m.gguf").has_tensor("output.weight") == !tied);
    convert_gguf_to_hf(t / "m.gguf", t / "back");
    const auto a = safetensors::load_checkpoint(t / "hf"), b = safetensors::load_checkpoint(t / "back");
    REQUIRE(a.size() == b.size());
    for (const auto& [name, x] : a) {
      INFO(name);
      REQUIRE(b.count(name));
      CHECK(bit_equal(x, b.at(name)));
    }
    check_same_config(load_model_config(t / "hf"), load_model_config(t / "back"));
    const auto ta = tokenizer::BPETokenizer::from_hf_file(t / "hf/tokenizer.json");
    const auto tb = tokenizer::BPETokenizer::from_hf_file(t / "back/tokenizer.json");
    check_same_tokenizer(ta, tb);
    CHECK(tokenizer::to_hf_json(ta) == tokenizer::to_hf_json(tb));
  }
}

TEST_CASE("hf-to-gguf: f16 / bf16 round 2-D weights, keep norms f32", "[convert][hf_to_gguf]") {
  TmpDir t("half");
  const LlamaConfig c = write_debug_hf(t / "hf", false, safetensors::kDefaultMaxShardBytes);
  const auto hf = safetensors::load_checkpoint(t / "hf");
  for (auto [out, dt, gt] : {std::tuple{GGUFOutType::f16, DType::f16, gguf::GGMLType::F16},
                             {GGUFOutType::bf16, DType::bf16, gguf::GGMLType::BF16}}) {
    INFO("outtype " << dt);
    convert_hf_to_gguf(t / "hf", t / "m.gguf", out);
    const auto g = gguf::GGUFFile::open(t / "m.gguf");
    CHECK(g.get_int("general.file_type", -1) == (out == GGUFOutType::f16 ? 1 : 32));
    const auto sd = load_gguf_state_dict(g, c);
    for (const auto& [name, x] : hf) {
      INFO(name);
      const auto& ti = g.tensor_info(hf_to_gguf_name(name));
      if (x.dim() == 1) {
        CHECK(ti.type == static_cast<uint32_t>(gguf::GGMLType::F32));
        CHECK(bit_equal(sd.at(name), x));
      } else {
        CHECK(ti.type == static_cast<uint32_t>(gt));
        CHECK(bit_equal(sd.at(name), x.to(dt).to(DType::f32)));
      }
    }
  }
}

TEST_CASE("hf-to-gguf: bad input names the directory and tensor", "[convert][hf_to_gguf]") {
  TmpDir t("bad");
  write_debug_hf(t / "hf", false, safetensors::kDefaultMaxShardBytes);
  CHECK_THROWS_WITH(parse_gguf_outtype("q4_0"), Catch::Contains("not supported"));
  // An extra tensor that is not a Llama weight.
  auto sd = safetensors::load_checkpoint(t / "hf");
  sd["model.extra.weight"] = sd.at("model.norm.weight");
  safetensors::save_file(sd, t / "hf/model.safetensors");
  CHECK_THROWS_WITH(convert_hf_to_gguf(t / "hf", t / "m.gguf"), Catch::Contains("model.extra.weight"));
  // A missing weight.
  sd.erase("model.extra.weight");
  sd.erase("model.layers.1.mlp.up_proj.weight");
  safetensors::save_file(sd, t / "hf/model.safetensors");
  CHECK_THROWS_WITH(convert_hf_to_gguf(t / "hf", t / "m.gguf"), Catch::Contains("model.layers.1.mlp.up_proj.weight"));
  // No tokenizer.
  fs::remove(t / "hf/tokenizer.json");
  CHECK_THROWS_WITH(convert_hf_to_gguf(t / "hf", t / "m.gguf"), Catch::Contains("tokenizer.json"));
}

TEST_CASE("hf-to-gguf: real GGUF -> HF -> GGUF (f32) loads to the same model and tokenizer", "[convert][real]") {
  const std::string path = "data/smollm2-135m-instruct.gguf";
  if (!fs::exists(path)) {
    WARN("SKIP: " << path << " is absent (run scripts/fetch-model.sh)");
    return;
  }
  TmpDir t("real");
  convert_gguf_to_hf(path, t / "hf");
  convert_hf_to_gguf(t / "hf", t / "back.gguf");
  const auto g1 = gguf::GGUFFile::open(path), g2 = gguf::GGUFFile::open(t / "back.gguf");
  const LlamaConfig c1 = model_config_from_gguf(g1), c2 = model_config_from_gguf(g2);
  CHECK(to_json(c1) == to_json(c2));
  const auto a = load_gguf_state_dict(g1, c1), b = load_gguf_state_dict(g2, c2);
  REQUIRE(a.size() == b.size());
  for (const auto& [name, x] : a) {
    INFO(name);
    REQUIRE(b.count(name));
    CHECK(bit_equal(x, b.at(name)));
  }
  check_same_tokenizer(tokenizer::BPETokenizer::from_gguf(g1), tokenizer::BPETokenizer::from_gguf(g2));
  CHECK(g1.get_string("tokenizer.chat_template", "") == g2.get_string("tokenizer.chat_template", ""));
  CHECK(g2.get_string("tokenizer.ggml.pre", "") == g1.get_string("tokenizer.ggml.pre", ""));
}
