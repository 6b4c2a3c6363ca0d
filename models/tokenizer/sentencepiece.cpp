// SentencePiece-style BPE tokenizer (see sentencepiece.h).
#include "models/tokenizer/sentencepiece.h"

#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include "models/formats/gguf.h"
#include "models/tokenizer/byte_level.h"
#include "tensor/error.h"

namespace dtr::tokenizer {

namespace {

const std::string kSpace = "\xe2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space

/// Byte length of the UTF-8 sequence starting with `lead` (1 for invalid leads: input is
/// validated before).
size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

size_t count_chars(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += utf8_len(static_cast<unsigned char>(s[i]))) ++n;
  return n;
}

/// Python's `not t.strip()` for a token made of ASCII / Unicode whitespace only, and " " in t.
bool whitespace_with_space(const std::string& t) {
  if (t.find(' ') == std::string::npos) return false;
  for (unsigned char ch : t)
    if (!(ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f')) return false;
  return true;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> merges_from_vocab(const std::vector<std::string>& tokens,
                                                                   const std::vector<double>& priority) {
  DTR_CHECK(priority.size() == tokens.size(), "merges_from_vocab: ", tokens.size(), " tokens but ", priority.size(),
            " priorities");
  std::unordered_map<std::string, int32_t> last;  // Python's {token: index}: the last index wins
  last.reserve(tokens.size() * 2);
  for (size_t i = 0; i < tokens.size(); ++i) last[tokens[i]] = static_cast<int32_t>(i);
  struct Entry {
    double prio;
    size_t len_l, len_r;
    int32_t l, r;
  };
  std::vector<Entry> entries;
  std::unordered_set<std::string> seen;
  std::vector<Entry> local;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (!seen.insert(t).second) continue;  // dict order: the first place of a text
    const double prio = priority[static_cast<size_t>(last[t])];
    local.clear();
    size_t chars_l = 0;
    for (size_t p = 0; p < t.size();) {
      p += utf8_len(static_cast<unsigned char>(t[p]));
      ++chars_l;
      if (p >= t.size()) break;
      auto il = last.find(t.substr(0, p)), ir = last.find(t.substr(p));
      if (il != last.end() && ir != last.end()) local.push_back({prio, chars_l, 0, il->second, ir->second});
    }
    const size_t total = count_chars(t);
    for (auto& e : local) e.len_r = total - e.len_l;
    std::sort(local.begin(), local.end(), [](const Entry& a, const Entry& b) { return a.l != b.l ? a.l < b.l : a.r < b.r; });
    entries.insert(entries.end(), local.begin(), local.end());
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    if (a.prio != b.prio) return a.prio > b.prio;
    if (a.len_l != b.len_l) return a.len_l > b.len_l;
    return a.len_r > b.len_r;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(entries.size());
  for (const auto& e : entries) out.emplace_back(tokens[static_cast<size_t>(e.l)], tokens[static_cast<size_t>(e.r)]);
  return out;
}

SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceVocab vocab) : vocab_(std::move(vocab)) {
  const size_t n = vocab_.tokens.size();
  DTR_CHECK(n > 0 && n < (1u << 31), "SentencePiece tokenizer: vocabulary size ", n, " out of range");
  if (vocab_.types.empty()) vocab_.types.assign(n, TokenType::normal);
  DTR_CHECK(vocab_.types.size() == n, "SentencePiece tokenizer: ", n, " tokens but ", vocab_.types.size(),
            " token types");
  token_to_id_.reserve(n * 2);
  token_bytes_.resize(n);
  std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& t = vocab_.tokens[i];
    token_to_id_[t] = id;
    unsigned b = 0;
    char tail = 0;
    if (vocab_.types[i] == TokenType::byte && t.size() == 6 && std::sscanf(t.c_str(), "<0x%2X>%c", &b, &tail) == 1) {
      token_bytes_[i] = std::string(1, static_cast<char>(b));
      byte_token_[b] = id;
    } else {
      token_bytes_[i] = replace_all(t, kSpace, " ");
    }
    if (vocab_.types[i] == TokenType::control || vocab_.types[i] == TokenType::user_defined) specials_.add(t, id);
  }
  specials_.finalize();
  merges_.reserve(vocab_.merges.size() * 2);
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    const auto& [a, b] = vocab_.merges[r];
    auto ia = token_to_id_.find(a), ib = token_to_id_.find(b), im = token_to_id_.find(a + b);
    DTR_CHECK(ia != token_to_id_.end() && ib != token_to_id_.end() && im != token_to_id_.end(),
              "SentencePiece tokenizer: merge ", r, " '", a, " ", b, "' names a token that is not in the vocabulary");
    merges_.add(ia->second, ib->second, static_cast<int32_t>(r), im->second);
  }
}

SentencePieceTokenizer SentencePieceTokenizer::from_gguf(const gguf::GGUFFile& g) {
  const std::string model = g.get_string("tokenizer.ggml.model", "");
  DTR_CHECK(model == "llama", g.path(), ": tokenizer.ggml.model is '", model,
            "', expected 'llama' for a SentencePiece tokenizer");
  DTR_CHECK(!g.get_bool("tokenizer.ggml.add_space_prefix", true), g.path(),
            ": tokenizer.ggml.add_space_prefix = true (SentencePiece's dummy space prefix) is not supported yet");
  SentencePieceVocab v;
  v.tokens = g.get("tokenizer.ggml.tokens").as_string_array();
  const size_t n = v.tokens.size();
  if (g.has("tokenizer.ggml.token_type"))
    for (int64_t t : g.get("tokenizer.ggml.token_type").as_int_array()) v.types.push_back(static_cast<TokenType>(t));
  DTR_CHECK(v.types.empty() || v.types.size() == n, g.path(), ": tokenizer.ggml.token_type has ", v.types.size(),
            " entries for ", n, " tokens");
  const std::string arch = g.get_string("general.architecture", "");
  const bool gemma = arch == "gemma" || arch == "gemma2" || arch == "gemma3";
  std::vector<double> priority(n);
  if (gemma) {
    // transformers' gemma_tokenizer: whitespace-only tokens stored with real spaces are looked up
    // as "\u2581..." (then they are no longer added tokens: their text is not in the vocabulary);
    // merges follow the file order, not the scores.
    for (size_t i = 0; i < n; ++i) {
      if (whitespace_with_space(v.tokens[i])) {
        std::string r;
        for (size_t k = 0, c = count_chars(v.tokens[i]); k < c; ++k) r += kSpace;
        v.tokens[i] = r;
        if (!v.types.empty() && v.types[i] == TokenType::user_defined) v.types[i] = TokenType::normal;
      }
      priority[i] = -static_cast<double>(i);
    }
  } else {
    const auto scores = g.get("tokenizer.ggml.scores").as_float_array();
    DTR_CHECK(scores.size() == n, g.path(), ": tokenizer.ggml.scores has ", scores.size(), " entries for ", n, " tokens");
    priority = scores;
  }
  v.merges = merges_from_vocab(v.tokens, priority);
  v.bos_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.bos_token_id", -1));
  v.eos_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.eos_token_id", -1));
  v.pad_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.padding_token_id", -1));
  v.unk_id = static_cast<int32_t>(g.get_int("tokenizer.ggml.unknown_token_id", -1));
  v.add_bos = g.get_bool("tokenizer.ggml.add_bos_token", true);
  return SentencePieceTokenizer(std::move(v));
}

SentencePieceTokenizer SentencePieceTokenizer::from_hf_json(const nlohmann::json& j, const std::string& src) {
  using nlohmann::json;
  try {
    DTR_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), src, ": no 'model' object");
    const json& m = j["model"];
    DTR_CHECK(m.value("type", "") == "BPE" && m.value("byte_fallback", false), src,
              ": model must be BPE with byte_fallback for a SentencePiece-style tokenizer");
    const json& norm = j.contains("normalizer") ? j["normalizer"] : json();
    const bool replace_space = norm.is_object() && norm.value("type", "") == "Replace" && norm.contains("pattern") &&
                               norm["pattern"].value("String", "") == " " && norm.value("content", "") == kSpace;
    DTR_CHECK(replace_space, src, ": normalizer ", norm.dump().substr(0, 120),
              " is not supported (only Replace(\" \", \"\u2581\"), as Gemma's)");
    const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
    DTR_CHECK(pre.is_null() || (pre.value("type", "") == "Split" && pre.contains("pattern") &&
                                pre["pattern"].value("String", "") == " "),
              src, ": pre_tokenizer ", pre.dump().substr(0, 120), " is not supported (none, or Split on \" \")");
    SentencePieceVocab v;
    const json& vocab = m.at("vocab");
    v.tokens.resize(vocab.size());
    std::vector<bool> have(vocab.size(), false);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int64_t id = it.value().get<int64_t>();
      DTR_CHECK(id >= 0 && static_cast<size_t>(id) < vocab.size() && !have[static_cast<size_t>(id)], src,
                ": vocab id ", id, " of '", it.key(), "' is out of range or repeated");
      v.tokens[static_cast<size_t>(id)] = it.key();
      have[static_cast<size_t>(id)] = true;
    }
    v.types.assign(v.tokens.size(), TokenType::normal);
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      const std::string& t = v.tokens[i];
      if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>') v.types[i] = TokenType::byte;
    }
    if (j.contains("added_tokens"))
      for (const auto& a : j["added_tokens"]) {
        const int64_t id = a.at("id").get<int64_t>();
        DTR_CHECK(id >= 0 && static_cast<size_t>(id) < v.tokens.size(), src, ": added token id ", id, " out of range");
        v.types[static_cast<size_t>(id)] = a.value("special", false) ? TokenType::control : TokenType::user_defined;
      }
    for (const auto& mg : m.at("merges")) {
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ');
        DTR_CHECK(sp != std::string::npos, src, ": merge '", s, "' has no space");
        v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {
        v.merges.emplace_back(mg.at(0).get<std::string>(), mg.at(1).get<std::string>());
      }
    }
    auto find = [&](const char* t) {
      for (size_t i = 0; i < v.tokens.size(); ++i)
        if (v.tokens[i] == t) return static_cast<int32_t>(i);
      return int32_t{-1};
    };
    v.bos_id = find("<bos>");
    v.eos_id = find("<eos>");
    v.pad_id = find("<pad>");
    v.unk_id = find("<unk>");
    v.add_bos = j.contains("post_processor") && j["post_processor"].dump().find("<bos>") != std::string::npos;
    return SentencePieceTokenizer(std::move(v));
  } catch (const json::exception& e) {
    DTR_ERROR(src, ": tokenizer.json: ", e.what());
  }
}

const std::string& SentencePieceTokenizer::token(int32_t id) const { return vocab_token(vocab_.tokens, id); }

int32_t SentencePieceTokenizer::token_to_id(const std::string& text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

bool SentencePieceTokenizer::is_special(int32_t id) const { return vocab_is_control(vocab_.types, id); }

void SentencePieceTokenizer::encode_segment(std::string_view text, size_t begin, size_t end, std::vector<int32_t>& out,
                                            Offsets* offsets) const {
  std::vector<int32_t> ids;
  std::vector<size_t> lens;  // bytes of the original text each symbol covers
  bool prev_unk = false;
  for (size_t p = begin; p < end;) {
    const size_t len = std::min(utf8_len(static_cast<unsigned char>(text[p])), end - p);
    const std::string ch = text[p] == ' ' ? kSpace : std::string(text.substr(p, len));
    auto it = token_to_id_.find(ch);
    if (it != token_to_id_.end()) {
      ids.push_back(it->second);
      lens.push_back(len);
      prev_unk = false;
    } else {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_token_[b] >= 0;
      if (all) {  // byte fallback
        for (unsigned char b : ch) {
          ids.push_back(byte_token_[b]);
          lens.push_back(1);
        }
        prev_unk = false;
      } else {
        DTR_CHECK(vocab_.unk_id >= 0, "SentencePiece tokenizer: character '", ch,
                  "' has no token, no byte tokens and there is no unknown token");
        if (prev_unk) lens.back() += len;  // fuse_unk
        else ids.push_back(vocab_.unk_id), lens.push_back(len);
        prev_unk = true;
      }
    }
    p += len;
  }
  bpe_merge(merges_, ids, &lens);
  out.insert(out.end(), ids.begin(), ids.end());
  if (offsets)
    for (size_t len : lens) {
      offsets->emplace_back(begin, begin + len);
      begin += len;
    }
}

std::vector<int32_t> SentencePieceTokenizer::encode_impl(std::string_view text, bool add_special, bool parse_special,
                                                         Offsets* offsets) const {
  const size_t ok = valid_utf8_prefix(text);
  DTR_CHECK(ok == text.size(), "tokenizer: input is not valid UTF-8 at byte offset ", ok);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && vocab_.add_bos && vocab_.bos_id >= 0) {
    out.push_back(vocab_.bos_id);
    if (offsets) offsets->emplace_back(0, 0);
  }
  size_t start = 0;
  if (parse_special && !specials_.empty()) {
    for (size_t i = 0; i < text.size();) {
      int32_t id = -1;
      const size_t len = specials_.match(text, i, id);
      if (len == 0) {
        ++i;
        continue;
      }
      if (i > start) encode_segment(text, start, i, out, offsets);
      out.push_back(id);
      if (offsets) offsets->emplace_back(i, i + len);
      i += len;
      start = i;
    }
  }
  if (start < text.size()) encode_segment(text, start, text.size(), out, offsets);
  return out;
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  return encode_impl(text, add_special, parse_special, nullptr);
}

std::vector<int32_t> SentencePieceTokenizer::encode_with_offsets(std::string_view text, Offsets& offsets,
                                                                 bool add_special, bool parse_special) const {
  offsets.clear();
  return encode_impl(text, add_special, parse_special, &offsets);
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return decode_token_bytes(token_bytes_, ids, skip_special);
}

}  // namespace dtr::tokenizer
