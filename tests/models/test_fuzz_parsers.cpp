// Mutation fuzzing of the binary / text parsers: valid files are mutated (bit flips, "interesting"
// 64-bit values written at random offsets, truncation, chunk duplication) with a fixed seed, so
// the same few thousand inputs run every time (a deterministic regression corpus). Every input
// must either load or throw dtr::Error; anything else (another exception type, a crash, an
// ASan report in a sanitizer build) fails. Override the count with DTR_FUZZ_ITERS.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <random>

#include "models/data/chat_dataset.h"
#include "models/data/token_shards.h"
#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/safetensors.h"
#include "models/test_util.h"
#include "models/tokenizer/byte_level.h"

using namespace dtr;

namespace {

int iterations() {
  const char* e = std::getenv("DTR_FUZZ_ITERS");
  return e ? std::atoi(e) : 1500;
}

std::string mutate(std::string s, std::mt19937_64& rng) {
  static const uint64_t interesting[] = {0, 1, 2, 7, 8, 0x7f, 0xff, 0x7fff, 0xffff, 0x7fffffff, 0x80000000ull,
                                         0xffffffffull, 1ull << 32, 1ull << 62, 0x7fffffffffffffffull, ~0ull};
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < n && !s.empty(); ++k) {
    switch (rng() % 4) {
      case 0: {  // flip bits
        const size_t i = rng() % s.size();
        s[i] = static_cast<char>(s[i] ^ (1u << (rng() % 8)));
        break;
      }
      case 1: {  // interesting value at a random offset
        const uint64_t v = interesting[rng() % (sizeof interesting / sizeof interesting[0])];
        const size_t w = std::size_t{1} << (rng() % 4);  // 1, 2, 4, 8 bytes
        const size_t i = rng() % s.size();
        for (size_t b = 0; b < w && i + b < s.size(); ++b) s[i + b] = static_cast<char>(v >> (8 * b));
        break;
      }
      case 2:  // truncate
        s.resize(rng() % s.size());
        break;
      default: {  // duplicate a chunk
        const size_t i = rng() % s.size(), len = std::min<size_t>(rng() % 64, s.size() - i);
        s.insert(rng() % s.size(), s.substr(i, len));
        break;
      }
    }
  }
  return s;
}

template <class F>
void fuzz(const std::string& seed, const std::string& path, uint64_t rng_seed, F parse) {
  std::mt19937_64 rng(rng_seed);
  int ok = 0, errors = 0;
  for (int it = 0; it < iterations(); ++it) {
    const std::string m = mutate(seed, rng);
    test::write_bytes(path, m);
    try {
      parse(path);
      ++ok;
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& e) {
      FAIL("iteration " << it << ": non-dtr exception " << typeid(e).name() << ": " << e.what());
    }
  }
  WARN(path << ": " << ok << " mutants loaded, " << errors << " rejected with dtr::Error");
}

}  // namespace

TEST_CASE("fuzz: safetensors parser", "[fuzz][safetensors]") {
  test::TempDir dir("fuzz_st");
  std::vector<float> f(24, 1.5f);
  std::vector<int64_t> i(5, 3);
  std::vector<uint8_t> u(3, 9);
  std::vector<safetensors::RawTensor> raw{{"a.weight", DType::f32, {4, 6}, f.data(), 96},
                                          {"b", DType::i64, {5}, i.data(), 40},
                                          {"c", DType::u8, {3}, u.data(), 3}};
  safetensors::write_raw(dir.file("seed.safetensors"), raw, {{"format", "pt"}});
  const std::string seed = test::read_bytes(dir.file("seed.safetensors"));
  fuzz(seed, dir.file("m.safetensors"), 1, [](const std::string& p) {
    auto file = safetensors::SafetensorsFile::open(p);
    for (const auto& k : file.keys()) (void)file.get(k, safetensors::LoadMode::copy);
  });
}

TEST_CASE("fuzz: GGUF parser and dequantisation", "[fuzz][gguf]") {
  test::TempDir dir("fuzz_gguf");
  gguf::GGUFWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 2);
  w.add("tokenizer.ggml.tokens", gguf::make_string_array({"a", "b", "<|x|>"}));
  w.add("tokenizer.ggml.token_type", gguf::make_i32_array({1, 1, 3}));
  w.add("nested", gguf::make_array(gguf::ValueType::array, {gguf::make_i32_array({1, 2})}));
  w.add_f32_tensor("f", {2, 32}, std::vector<float>(64, 0.5f), gguf::GGMLType::F16);
  w.add_tensor("q8", {32, 2}, 8, std::string(2 * 34, '\x11'));
  w.add_tensor("q41", {32}, 3, std::string(20, '\x22'));
  w.add_tensor("q6k", {256}, 14, std::string(210, '\x33'));
  const std::string seed = w.bytes();
  fuzz(seed, dir.file("m.gguf"), 2, [](const std::string& p) {
    auto g = gguf::GGUFFile::open(p);
    for (const auto& k : g.keys()) (void)g.get(k).str();
    for (const auto& t : g.tensors()) (void)g.dequantize(t.name);
  });
}

TEST_CASE("fuzz: llm.c shards and chat JSONL", "[fuzz][data]") {
  test::TempDir dir("fuzz_data");
  data::write_token_shard(dir.file("seed.bin"), {1, 2, 3, 4, 5}, 1);
  fuzz(test::read_bytes(dir.file("seed.bin")), dir.file("m.bin"), 3,
       [](const std::string& p) { (void)data::read_token_shard(p); });
  const std::string jsonl =
      R"({"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A \u00e9!"}]})"
      "\n"
      R"({"prompt": "p", "response": "r", "system": "s"})"
      "\n";
  fuzz(jsonl, dir.file("m.jsonl"), 4, [](const std::string& p) { (void)data::read_chat_jsonl(p); });
}
