// BPETokenizer loaders: GGUF metadata (tokenizer.ggml.*) and Hugging Face tokenizer.json.
#include <filesystem>

#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/mapped_file.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "tensor/error.h"

namespace dtr::tokenizer {

using nlohmann::json;

namespace {
std::pair<std::string, std::string> split_merge(const std::string& m, size_t rank, const std::string& src) {
  const size_t sp = m.find(' ', 1);
  DTR_CHECK(sp != std::string::npos && sp + 1 < m.size(), src, ": merge ", rank, " '", m,
            "' is not two tokens separated by a space");
  return {m.substr(0, sp), m.substr(sp + 1)};
}
}  // namespace

BPETokenizer BPETokenizer::from_gguf(const gguf::GGUFFile& g) {
  const std::string& src = g.path();
  const std::string model = g.get_string("tokenizer.ggml.model", "");
  DTR_CHECK(model == "gpt2", src, ": tokenizer.ggml.model = '", model,
            "' is not supported (only byte-level BPE, \"gpt2\")");
  BPEVocab v;
  try {
    v.tokens = g.get("tokenizer.ggml.tokens").as_string_array();
    const auto merges = g.get("tokenizer.ggml.merges").as_string_array();
    for (size_t r = 0; r < merges.size(); ++r) v.merges.push_back(split_merge(merges[r], r, src + " tokenizer.ggml.merges"));
    if (g.has("tokenizer.ggml.token_type")) {
      for (int64_t t : g.get("tokenizer.ggml.token_type").as_int_array()) v.types.push_back(static_cast<TokenType>(t));
    }
  } catch (const Error& e) {
    DTR_ERROR(src, ": bad tokenizer metadata: ", e.what());
  }
  v.bos_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.bos_token_id", -1));
  v.eos_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.eos_token_id", -1));
  v.pad_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.padding_token_id", -1));
  v.unk_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.unknown_token_id", -1));
  v.add_bos = g.get_bool("tokenizer.ggml.add_bos_token", false);
  const std::string pre = g.get_string("tokenizer.ggml.pre", "default");
  v.pre_patterns = PreTokenizer::from_gguf_name(pre)->patterns();
  v.ignore_merges = pre == "llama3" || pre == "llama-bpe";
  const auto n = static_cast<int32_t>(v.tokens.size());
  for (auto [name, id] : {std::pair{"bos", v.bos_id}, {"eos", v.eos_id}, {"padding", v.pad_id}, {"unknown", v.unk_id}})
    DTR_CHECK(id < n, src, ": tokenizer.ggml.", name, "_token_id = ", id, " is outside the vocabulary of ", n);
  return BPETokenizer(std::move(v));
}

namespace {

// Appends the regex steps of one HF pre-tokenizer node.
void hf_pre_tokenizer(const json& p, const std::string& src, std::vector<std::string>& steps) {
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& q : p.at("pretokenizers")) hf_pre_tokenizer(q, src, steps);
  } else if (type == "ByteLevel") {
    DTR_CHECK(!p.value("add_prefix_space", false), src, ": ByteLevel add_prefix_space=true is not supported");
    if (p.value("use_regex", true)) steps.push_back(kGpt2Pattern);
  } else if (type == "Digits") {
    steps.push_back(p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
  } else if (type == "Split") {
    const std::string behavior = p.value("behavior", "");
    DTR_CHECK(behavior == "Isolated", src, ": Split pre-tokenizer behavior '", behavior,
              "' is not supported (only Isolated)");
    DTR_CHECK(!p.value("invert", false), src, ": Split pre-tokenizer with invert=true is not supported");
    const json& pat = p.at("pattern");
    if (pat.contains("Regex")) steps.push_back(pat["Regex"].get<std::string>());
    else {
      // A literal string: escape it for PCRE2 with \Q...\E.
      steps.push_back("\\Q" + pat.at("String").get<std::string>() + "\\E");
    }
  } else {
    DTR_ERROR(src, ": pre_tokenizer type '", type, "' is not supported (ByteLevel, Digits, Split, Sequence)");
  }
}

std::string token_content(const json& t) {
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content")) return t["content"].get<std::string>();
  return "";
}

}  // namespace

BPETokenizer BPETokenizer::from_hf_json(const json& j, const std::string& src, const std::string& bos_token,
                                        const std::string& eos_token) {
  try {
    DTR_CHECK(j.is_object() && j.contains("model"), src, ": missing key 'model'");
    const json& m = j["model"];
    const std::string type = m.value("type", "BPE");
    DTR_CHECK(type == "BPE", src, ": model.type '", type, "' is not supported (only BPE)");
    DTR_CHECK(!m.value("byte_fallback", false), src, ": byte_fallback BPE (SentencePiece style) is not supported");
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      DTR_ERROR(src, ": normalizer '", j["normalizer"].value("type", "?"), "' is not supported");
    DTR_CHECK(m.contains("vocab") && m["vocab"].is_object(), src, ": missing object key 'model.vocab'");
    BPEVocab v;
    int64_t max_id = -1;
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      const auto id = it.value().get<int64_t>();
      DTR_CHECK(id >= 0, src, ": negative id ", id, " for token '", it.key(), "' in model.vocab");
      max_id = std::max(max_id, id);
    }
    size_t n_added = 0;
    if (j.contains("added_tokens")) {
      DTR_CHECK(j["added_tokens"].is_array(), src, ": 'added_tokens' must be an array");
      for (const auto& t : j["added_tokens"]) {
        const auto id = t.at("id").get<int64_t>();
        DTR_CHECK(id >= 0, src, ": negative id ", id, " in added_tokens");
        max_id = std::max(max_id, id);
        ++n_added;
      }
    }
    // Ids are dense in real vocabularies; a few holes are tolerated, a huge id is corruption
    // (it would allocate that many tokens).
    const auto n_entries = static_cast<int64_t>(m["vocab"].size() + n_added);
    DTR_CHECK(max_id >= 0 && max_id < 2 * n_entries + 1024, src, ": bad vocabulary ids (max id ", max_id, " for ",
              n_entries, " entries)");
    v.tokens.assign(static_cast<size_t>(max_id + 1), "");
    v.types.assign(static_cast<size_t>(max_id + 1), TokenType::unused);
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      const auto id = it.value().get<int64_t>();
      v.tokens[static_cast<size_t>(id)] = it.key();
      v.types[static_cast<size_t>(id)] = TokenType::normal;
    }
    if (j.contains("added_tokens")) {
      for (const auto& t : j["added_tokens"]) {
        const auto id = static_cast<size_t>(t.at("id").get<int64_t>());
        v.tokens[id] = t.at("content").get<std::string>();
        v.types[id] = t.value("special", false) ? TokenType::control : TokenType::user_defined;
      }
    }
    const json& merges = m.at("merges");
    for (size_t r = 0; r < merges.size(); ++r) {
      if (merges[r].is_array()) v.merges.emplace_back(merges[r].at(0).get<std::string>(), merges[r].at(1).get<std::string>());
      else v.merges.push_back(split_merge(merges[r].get<std::string>(), r, src + " model.merges"));
    }
    v.ignore_merges = m.value("ignore_merges", false);
    v.pre_patterns.clear();
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) hf_pre_tokenizer(j["pre_tokenizer"], src, v.pre_patterns);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      for (size_t i = 0; i < v.tokens.size(); ++i)
        if (v.tokens[i] == m["unk_token"].get<std::string>()) v.unk_id = static_cast<int32_t>(i);
    }
    auto find = [&](const std::string& s) {
      for (size_t i = 0; i < v.tokens.size(); ++i)
        if (!s.empty() && v.tokens[i] == s) return static_cast<int32_t>(i);
      return int32_t{-1};
    };
    v.bos_id = find(bos_token);
    v.eos_id = find(eos_token);
    return BPETokenizer(std::move(v));
  } catch (const json::exception& e) {
    DTR_ERROR(src, ": bad tokenizer.json: ", e.what());
  }
}

BPETokenizer BPETokenizer::from_hf_file(const std::string& path) {
  auto parse = [](const std::string& p) {
    try {
      return json::parse(read_file_to_string(p));
    } catch (const json::parse_error& e) {
      DTR_ERROR(p, ": JSON error at byte ", e.byte, ": ", e.what());
    } catch (const json::exception& e) {  // e.g. out_of_range: a number too large for a double
      DTR_ERROR(p, ": JSON error: ", e.what());
    }
  };
  const json j = parse(path);
  std::string bos, eos;
  bool add_bos = false;
  const auto cfg = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(cfg)) {
    const json c = parse(cfg.string());
    if (c.contains("bos_token")) bos = token_content(c["bos_token"]);
    if (c.contains("eos_token")) eos = token_content(c["eos_token"]);
    add_bos = c.value("add_bos_token", false);
  }
  BPETokenizer t = from_hf_json(j, path, bos, eos);
  if (add_bos) {
    BPEVocab v = t.vocab();
    v.add_bos = true;
    return BPETokenizer(std::move(v));
  }
  return t;
}

}  // namespace dtr::tokenizer

// ---- export -----------------------------------------------------------------------------------
namespace dtr::tokenizer {

json to_hf_json(const BPETokenizer& tok) {
  const BPEVocab& v = tok.vocab();
  json vocab = json::object(), added = json::array(), merges = json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const TokenType t = v.types[i];
    if (t == TokenType::control || t == TokenType::user_defined) {
      added.push_back({{"id", i}, {"content", v.tokens[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", t == TokenType::control}});
    }
    if (t != TokenType::unused || !v.tokens[i].empty()) vocab[v.tokens[i]] = i;
  }
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json pre;
  const auto& p = v.pre_patterns;
  if (p.size() == 1 && p[0] == kGpt2Pattern) {
    pre = byte_level;
  } else if (p.size() == 2 && p[0] == R"(\p{N})" && p[1] == kGpt2Pattern) {
    pre = {{"type", "Sequence"},
           {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  } else {
    json seq = json::array();
    for (const auto& r : p)
      seq.push_back({{"type", "Split"}, {"pattern", {{"Regex", r}}}, {"behavior", "Isolated"}, {"invert", false}});
    json bl = byte_level;
    bl["use_regex"] = false;
    seq.push_back(bl);
    pre = {{"type", "Sequence"}, {"pretokenizers", seq}};
  }
  json unk = v.unk_id >= 0 ? json(v.tokens[static_cast<size_t>(v.unk_id)]) : json(nullptr);
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", unk}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
        {"ignore_merges", v.ignore_merges}, {"vocab", vocab}, {"merges", merges}}},
  };
}

json to_hf_tokenizer_config(const BPETokenizer& tok, const std::string& chat_template, int64_t model_max_length) {
  const BPEVocab& v = tok.vocab();
  auto text = [&](int32_t id) { return id >= 0 ? json(v.tokens[static_cast<size_t>(id)]) : json(nullptr); };
  json c = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"bos_token", text(v.bos_id)}, {"eos_token", text(v.eos_id)},
            {"pad_token", text(v.pad_id)}, {"unk_token", text(v.unk_id)}, {"add_bos_token", v.add_bos},
            {"add_prefix_space", false}, {"clean_up_tokenization_spaces", false},
            {"model_max_length", model_max_length}};
  if (!chat_template.empty()) c["chat_template"] = chat_template;
  return c;
}

void save_hf_tokenizer(const BPETokenizer& tok, const std::string& dir, const std::string& chat_template,
                       int64_t model_max_length) {
  std::filesystem::create_directories(dir);
  auto write = [](const json& j, const std::string& path) {
    const std::string s = j.dump(2) + "\n";
    AtomicFileWriter w(path);
    w.write(s.data(), s.size());
    w.commit();
  };
  write(to_hf_json(tok), (std::filesystem::path(dir) / "tokenizer.json").string());
  write(to_hf_tokenizer_config(tok, chat_template, model_max_length),
        (std::filesystem::path(dir) / "tokenizer_config.json").string());
}

void add_gguf_tokenizer(gguf::GGUFWriter& w, const BPETokenizer& tok, const std::string& chat_template,
                        int64_t vocab_size) {
  const BPEVocab& v = tok.vocab();
  const std::string pre = PreTokenizer::gguf_name(v.pre_patterns);
  DTR_CHECK(!pre.empty(), "add_gguf_tokenizer: the pre-tokenizer regexes have no GGUF tokenizer.ggml.pre name");
  const auto n = static_cast<int64_t>(v.tokens.size());
  DTR_CHECK(vocab_size >= n, "add_gguf_tokenizer: vocab_size ", vocab_size, " is below the tokenizer's ", n,
            " tokens");
  std::vector<std::string> tokens = v.tokens;
  std::vector<int32_t> types;
  for (int64_t i = 0; i < n; ++i)
    types.push_back(static_cast<int32_t>(v.types.empty() ? TokenType::normal : v.types[static_cast<size_t>(i)]));
  for (int64_t i = n; i < vocab_size; ++i) {
    tokens.push_back("[PAD" + std::to_string(i) + "]");
    types.push_back(static_cast<int32_t>(TokenType::unused));
  }
  std::vector<std::string> merges;
  merges.reserve(v.merges.size());
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", pre);
  w.add("tokenizer.ggml.tokens", gguf::make_string_array(tokens));
  w.add("tokenizer.ggml.token_type", gguf::make_i32_array(types));
  w.add("tokenizer.ggml.merges", gguf::make_string_array(merges));
  for (auto [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", v.bos_id}, {"tokenizer.ggml.eos_token_id", v.eos_id},
                         {"tokenizer.ggml.padding_token_id", v.pad_id}, {"tokenizer.ggml.unknown_token_id", v.unk_id}})
    if (id >= 0) w.add_u32(key, static_cast<uint32_t>(id));
  w.add_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  if (!chat_template.empty()) w.add_string("tokenizer.chat_template", chat_template);
}

}  // namespace dtr::tokenizer
