// PEFT target_modules matching (see module_matcher.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "models/lora/module_matcher.h"

#include <pcre2.h>

#include <vector>

#include "tensor/error.h"

namespace dtr {
namespace {

/// Ints of DFA workspace per match. It bounds the states alive at one subject position (about
/// 3 ints each, two lists), hence the time per character whatever the pattern: an alternation
/// of a few thousand FQNs (what save_peft_adapter writes for an irregular selection) fits.
constexpr size_t kDfaWorkspace = 1 << 15;

std::string shown(const std::string& p) { return p.size() <= 120 ? p : p.substr(0, 117) + "..."; }

}  // namespace

struct ModuleMatcher::Regex {
  pcre2_code* code = nullptr;
  std::string pattern;
  ~Regex() { pcre2_code_free(code); }
  /// pcre2_dfa_match's return code for `s` (anchored at both ends).
  int run(const std::string& s) const {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    DTR_CHECK(md != nullptr, "module matcher: out of memory");
    thread_local std::vector<int> ws(kDfaWorkspace);
    const int rc = pcre2_dfa_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0,
                                   PCRE2_ANCHORED, md, nullptr, ws.data(), ws.size());
    pcre2_match_data_free(md);
    return rc;
  }
};

ModuleMatcher ModuleMatcher::list(std::vector<std::string> names, const std::string& where) {
  for (const auto& n : names)
    DTR_CHECK(n.size() <= kMaxPatternBytes, where, ": target_modules entry of ", n.size(), " bytes (more than ",
              kMaxPatternBytes, "): '", shown(n), "'");
  ModuleMatcher m;
  m.names_ = std::move(names);
  m.where_ = where;
  return m;
}

ModuleMatcher ModuleMatcher::regex(const std::string& pattern, const std::string& where) {
  DTR_CHECK(pattern.size() <= kMaxPatternBytes, where, ": target_modules regex of ", pattern.size(),
            " bytes (more than ", kMaxPatternBytes, "): '", shown(pattern), "'");
  auto compile = [&](const std::string& p) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_NEVER_BACKSLASH_C, &err,
                                     &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      DTR_ERROR(where, ": target_modules regex '", shown(pattern), "' does not compile at offset ", off, ": ",
                reinterpret_cast<char*>(msg));
    }
    return code;
  };
  pcre2_code_free(compile(pattern));  // the pattern alone must be valid ("a)(b" is not)
  auto r = std::make_shared<Regex>();
  r->pattern = pattern;
  // Full match (Python re.fullmatch): anchored at the start, \z at the end.
  r->code = compile("(?:" + pattern + ")\\z");
  uint32_t backrefs = 0;
  pcre2_pattern_info(r->code, PCRE2_INFO_BACKREFMAX, &backrefs);
  // Other features the DFA algorithm lacks (callouts, backtracking verbs) fail at match time,
  // as a clear error from matches(); try the empty name once so most show up here.
  const int rc = backrefs > 0 ? PCRE2_ERROR_DFA_UITEM : r->run("");
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    DTR_ERROR(where, ": target_modules regex '", shown(pattern),
              "' is not supported (dtr matches without backtracking: no backreferences, callouts or "
              "backtracking verbs): ", reinterpret_cast<char*>(msg));
  }
  ModuleMatcher m;
  m.regex_ = std::move(r);
  m.where_ = where;
  return m;
}

bool ModuleMatcher::matches(const std::string& fqn) const {
  if (!regex_) {
    for (const auto& t : names_)
      if (fqn == t || (fqn.size() > t.size() && fqn.ends_with(t) && fqn[fqn.size() - t.size() - 1] == '.'))
        return true;
    return false;
  }
  const int rc = regex_->run(fqn);
  if (rc >= 0) return true;
  if (rc == PCRE2_ERROR_NOMATCH || rc == PCRE2_ERROR_PARTIAL) return false;
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(rc, msg, sizeof msg);
  DTR_ERROR(where_, ": target_modules regex '", shown(regex_->pattern), "' is too complex to match '", fqn,
            "': ", reinterpret_cast<char*>(msg));
}

}  // namespace dtr
