// Fuzz targets of dtr's parsers (see targets.h).
#include "fuzz/targets.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>

#include "models/data/chat_dataset.h"
#include "models/data/token_shards.h"
#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/hf_config.h"
#include "models/formats/safetensors.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "models/tokenizer/byte_level.h"
#include "tensor/error.h"

namespace dtr::fuzz {

namespace {

// A per-process scratch directory (tmpfs when there is one), removed at exit.
struct Scratch {
  std::filesystem::path dir;
  Scratch() {
    const std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    dir = base / ("dtr_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string p = (dir / name).string();
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
};
const Scratch& scratch() {
  static Scratch s;
  return s;
}

void invariant(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("fuzz invariant violated: " + what);
}

// Text every loaded tokenizer must round-trip (ASCII, Unicode, digits, special-token text).
constexpr const char* kProbe = "Hello world 12345 <|im_start|>user\n héllo, 世界!\t\t  x<|im_end|>";

void fuzz_safetensors(std::string_view in) {
  const auto f = safetensors::SafetensorsFile::open(scratch().write("m.safetensors", in));
  for (const auto& k : f.keys()) {
    (void)f.get(k, safetensors::LoadMode::copy);
    (void)f.get(k, safetensors::LoadMode::view);
  }
}

void fuzz_gguf(std::string_view in) {
  const auto g = gguf::GGUFFile::open(scratch().write("m.gguf", in));
  for (const auto& k : g.keys()) (void)g.get(k).str();
  for (const auto& t : g.tensors()) (void)g.dequantize(t.name);
  // What dtr reads from the metadata of a model file (each may fail on its own).
  try {
    (void)model_config_from_gguf(g);
  } catch (const Error&) {
  }
  const auto tok = tokenizer::BPETokenizer::from_gguf(g);
  (void)tok.decode(tok.encode(kProbe));
}

void fuzz_hf_config(std::string_view in) {
  const LlamaConfig c = load_model_config(scratch().write("config.json", in));
  // Export and re-import: a fixed point.
  const auto j = to_json(c);
  invariant(to_json(model_config_from_json(j, "re-import")) == j, "config.json round trip: " + j.dump());
}

void fuzz_tokenizer_json(std::string_view in) {
  const auto tok = tokenizer::BPETokenizer::from_hf_file(scratch().write("tokenizer.json", in));
  const auto ids = tok.encode(kProbe);
  invariant(tok.decode(ids) == kProbe, "decode(encode(probe)) != probe");
  // Offsets: the same ids, and each token's byte range holds what it decodes to.
  std::vector<std::pair<size_t, size_t>> off;
  invariant(tok.encode_with_offsets(kProbe, off) == ids, "encode_with_offsets ids != encode ids");
  const std::string probe(kProbe);
  size_t pos = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    invariant(off[k].first == pos && off[k].second >= pos && off[k].second <= probe.size() &&
                  probe.compare(off[k].first, off[k].second - off[k].first, tok.decode({ids[k]})) == 0,
              "token " + std::to_string(k) + "'s offsets do not hold its bytes");
    pos = off[k].second;
  }
  invariant(pos == probe.size(), "offsets do not cover the probe");
}

void fuzz_chat_jsonl(std::string_view in) {
  const auto convs = data::read_chat_jsonl(scratch().write("m.jsonl", in));
  const auto tmpl = tokenizer::ChatTemplate::smollm2();
  for (const auto& c : convs) {
    std::string joined;
    for (const auto& s : tmpl.render_segments(c, false)) joined += s.text;
    invariant(joined == tmpl.render(c, false), "render_segments concatenation != render");
  }
}

void fuzz_token_shard(std::string_view in) {
  const auto tokens = data::read_token_shard(scratch().write("m.bin", in));
  invariant(1024 + 2 * tokens.size() <= in.size(), "more tokens than the file has bytes for");
}

const std::map<std::string, std::function<void(std::string_view)>>& registry() {
  static const std::map<std::string, std::function<void(std::string_view)>> r = {
      {"safetensors", fuzz_safetensors}, {"gguf", fuzz_gguf},           {"hf_config", fuzz_hf_config},
      {"tokenizer_json", fuzz_tokenizer_json}, {"chat_jsonl", fuzz_chat_jsonl}, {"token_shard", fuzz_token_shard},
  };
  return r;
}

// ---- seeds ------------------------------------------------------------------------------------

std::string read_back(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

tokenizer::BPEVocab seed_vocab() {
  tokenizer::BPEVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(tokenizer::bytes_to_unicode(std::string(1, static_cast<char>(b))));
  v.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}};
  for (const auto& [a, b] : v.merges) v.tokens.push_back(a + b);
  v.tokens.push_back("<|im_start|>");
  v.tokens.push_back("<|im_end|>");
  v.types.assign(v.tokens.size(), tokenizer::TokenType::normal);
  v.types[v.tokens.size() - 2] = v.types[v.tokens.size() - 1] = tokenizer::TokenType::control;
  v.eos_id = static_cast<int32_t>(v.tokens.size() - 1);
  v.pre_patterns = {R"(\p{N})", tokenizer::kGpt2Pattern};
  return v;
}

std::vector<std::string> seeds_of(const std::string& name) {
  if (name == "safetensors") {
    std::vector<float> f(24, 1.5f);
    std::vector<int64_t> i(5, 3);
    std::vector<uint16_t> h(4, 0x3c00);
    std::vector<uint8_t> u(3, 9);
    const std::string p = (scratch().dir / "seed.safetensors").string();
    safetensors::write_raw(p, {{"a.weight", DType::f32, {4, 6}, f.data(), 96}, {"b", DType::i64, {5}, i.data(), 40},
                               {"h", DType::bf16, {2, 2}, h.data(), 8}, {"c", DType::u8, {3}, u.data(), 3}},
                           {{"format", "pt"}});
    return {read_back(p)};
  }
  if (name == "gguf") {
    gguf::GGUFWriter w;
    w.add_string("general.architecture", "llama");
    w.add_u32("llama.embedding_length", 64);
    w.add_u32("llama.feed_forward_length", 128);
    w.add_u32("llama.block_count", 2);
    w.add_u32("llama.attention.head_count", 4);
    w.add_u32("llama.attention.head_count_kv", 2);
    w.add_f32("llama.rope.freq_base", 10000.f);
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    const auto v = seed_vocab();
    std::vector<std::string> merges;
    for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
    std::vector<int32_t> types;
    for (auto t : v.types) types.push_back(static_cast<int32_t>(t));
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "smollm");
    w.add("tokenizer.ggml.tokens", gguf::make_string_array(v.tokens));
    w.add("tokenizer.ggml.merges", gguf::make_string_array(merges));
    w.add("tokenizer.ggml.token_type", gguf::make_i32_array(types));
    w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos_id));
    w.add("nested", gguf::make_array(gguf::ValueType::array, {gguf::make_i32_array({1, 2})}));
    w.add_f32_tensor("f", {2, 32}, std::vector<float>(64, 0.5f), gguf::GGMLType::F16);
    w.add_f32_tensor("b", {32}, std::vector<float>(32, 0.25f), gguf::GGMLType::BF16);
    w.add_tensor("q8", {32, 2}, 8, std::string(2 * 34, '\x11'));
    w.add_tensor("q41", {32}, 3, std::string(20, '\x22'));
    w.add_tensor("q6k", {256}, 14, std::string(210, '\x33'));
    w.add_tensor("q4k", {256}, 12, std::string(144, '\x44'));
    return {w.bytes()};
  }
  if (name == "hf_config") {
    return {R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
 "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
 "num_key_value_heads": 3, "max_position_embeddings": 8192, "rope_theta": 100000, "rms_norm_eps": 1e-05,
 "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 2,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
 "torch_dtype": "bfloat16", "hidden_act": "silu"})",
            R"({"vocab_size": 8, "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1,
 "num_attention_heads": 2, "head_dim": 6, "rope_parameters": {"rope_theta": 5.0}})"};
  }
  if (name == "tokenizer_json") {
    return {tokenizer::to_hf_json(tokenizer::BPETokenizer(seed_vocab())).dump()};
  }
  if (name == "chat_jsonl") {
    return {R"({"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A \u00e9!"}]})"
            "\n"
            R"({"prompt": "p", "response": "r", "system": "s"})"
            "\n\n"};
  }
  if (name == "token_shard") {
    const std::string p1 = (scratch().dir / "seed1.bin").string(), p2 = (scratch().dir / "seed2.bin").string();
    data::write_token_shard(p1, {1, 2, 3, 4, 5}, 1);
    data::write_token_shard(p2, {70000, 2, 3}, 2);
    return {read_back(p1), read_back(p2)};
  }
  throw std::invalid_argument("dtr fuzz: unknown target '" + name + "'");
}

}  // namespace

const std::vector<std::string>& target_names() {
  static const std::vector<std::string> n = {"safetensors", "gguf", "hf_config", "tokenizer_json", "chat_jsonl",
                                             "token_shard"};
  return n;
}

bool run_target(const std::string& name, std::string_view input) {
  const auto it = registry().find(name);
  if (it == registry().end()) throw std::invalid_argument("dtr fuzz: unknown target '" + name + "'");
  try {
    it->second(input);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::vector<std::string> seed_inputs(const std::string& name) { return seeds_of(name); }

}  // namespace dtr::fuzz
