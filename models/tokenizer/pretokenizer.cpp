#include "models/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <map>

#include "tensor/error.h"

namespace dtr::tokenizer {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {
const char* const kLlama3Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Registry: GGUF tokenizer.ggml.pre name -> regex steps (llama.cpp llama-vocab.cpp groups).
const std::map<std::string, std::vector<std::string>>& presets() {
  static const std::map<std::string, std::vector<std::string>> m = {
      {"default", {kGpt2Pattern}},
      {"gpt2", {kGpt2Pattern}},
      {"gpt-2", {kGpt2Pattern}},
      {"smollm", {R"(\p{N})", kGpt2Pattern}},
      {"starcoder", {R"(\p{N})", kGpt2Pattern}},
      {"refact", {R"(\p{N})", kGpt2Pattern}},
      {"codeshell", {R"(\p{N})", kGpt2Pattern}},
      {"command-r", {R"(\p{N})", kGpt2Pattern}},
      {"llama3", {kLlama3Pattern}},
      {"llama-bpe", {kLlama3Pattern}},
      {"qwen2", {kQwen2Pattern}},
  };
  return m;
}
}  // namespace

RegexSplit::RegexSplit(const std::string& pattern) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    DTR_ERROR("pre-tokenizer regex does not compile at offset ", off, ": ", reinterpret_cast<char*>(msg),
              " (pattern: ", pattern, ")");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  code_ = code;
}

RegexSplit::~RegexSplit() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void RegexSplit::split(std::string_view text, std::vector<std::string_view>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  DTR_CHECK(md != nullptr, "pre-tokenizer: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, last = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      DTR_ERROR("pre-tokenizer: regex match error ", rc, " at byte ", pos);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (e == s) {  // empty match: step over one UTF-8 character
      if (s >= text.size()) break;
      pos = s + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (s > last) out.push_back(text.substr(last, s - last));
    out.push_back(text.substr(s, e - s));
    last = pos = e;
  }
  if (last < text.size()) out.push_back(text.substr(last));
  pcre2_match_data_free(md);
}

PreTokenizer::PreTokenizer(const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) steps_.push_back(std::make_shared<RegexSplit>(p));
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> cur{text}, next;
  if (text.empty()) return {};
  for (const auto& step : steps_) {
    next.clear();
    for (auto piece : cur) step->split(piece, next);
    cur.swap(next);
  }
  return cur;
}

std::vector<std::string> PreTokenizer::patterns() const {
  std::vector<std::string> p;
  for (const auto& s : steps_) p.push_back(s->pattern());
  return p;
}

std::shared_ptr<PreTokenizer> PreTokenizer::from_gguf_name(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string known;
    for (const auto& kv : presets()) known += (known.empty() ? "" : ", ") + kv.first;
    DTR_ERROR("unknown GGUF pre-tokenizer '", name, "' (tokenizer.ggml.pre); known: ", known);
  }
  return std::make_shared<PreTokenizer>(it->second);
}

std::string PreTokenizer::gguf_name(const std::vector<std::string>& patterns) {
  // Preferred names first (several names share the same regexes).
  for (const char* name : {"gpt2", "smollm", "llama-bpe", "qwen2"})
    if (presets().at(name) == patterns) return name;
  for (const auto& [name, p] : presets())
    if (p == patterns) return name;
  return "";
}

}  // namespace dtr::tokenizer
