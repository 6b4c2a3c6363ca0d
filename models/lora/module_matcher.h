#pragma once
// Which modules a PEFT adapter targets: Hugging Face PEFT's target_modules semantics with a
// matcher whose time is bounded whatever the pattern (patterns come from files: an
// adapter_config.json written by anyone, a recipe).
//   list form:  a module matches when its FQN equals an entry or ends with "." + entry
//               (PEFT check_target_module_exists);
//   regex form: the pattern must match the whole FQN (Python re.fullmatch). Matched by
//               PCRE2's DFA algorithm (pcre2_dfa_match): no backtracking, so a pattern like
//               "(.*.*)*q_projX" costs O(|fqn| x |pattern|) instead of exponential time.
//               The DFA's fixed workspace bounds the states alive at one position, so the
//               time per character is bounded too. Patterns longer than kMaxPatternBytes,
//               with features the DFA lacks (backreferences, recursion, \C) or needing more
//               workspace are rejected with an error naming the pattern and its source.
// Source: peft/tuners/tuners_utils.py (check_target_module_exists), PCRE2 pcre2matching(3).
#include <memory>
#include <string>
#include <vector>

namespace dtr {

class ModuleMatcher {
 public:
  /// Longest accepted pattern (bytes): room for an alternation of ~2000 full FQNs.
  static constexpr size_t kMaxPatternBytes = 1 << 16;

  /// List form. Errors: an entry longer than kMaxPatternBytes (`where` names the source).
  static ModuleMatcher list(std::vector<std::string> names, const std::string& where);
  /// Regex form (full match). Errors: too long, does not compile (offset and PCRE2's
  /// message), uses a feature the DFA matcher lacks; each naming `where` and the pattern.
  static ModuleMatcher regex(const std::string& pattern, const std::string& where);

  /// True when `fqn` is selected. Errors: the DFA workspace is exhausted (pattern too complex).
  bool matches(const std::string& fqn) const;

 private:
  struct Regex;
  std::vector<std::string> names_;
  std::shared_ptr<const Regex> regex_;
  std::string where_;
};

}  // namespace dtr
