#pragma once
// The DTR_* environment variables: one table of every variable dtr reads (name, kind, range,
// meaning), the typed readers every layer uses, and the start-up check that parses all of
// them at once (dtr::init calls it), so a bad value is a one-line error before any work
// instead of an exception from whichever code reads the variable first.
//
// Kinds: flag ("1" on; "0", "" or unset off), number (finite, in [lo, hi]), integer (in
// [lo, hi]), choice (one of a list), text (anything; tests and scripts only).
#include <cstdint>
#include <string>
#include <vector>

namespace dtr::env {

enum class Kind { flag, number, integer, choice, text };

/// One row of the table.
struct Var {
  const char* name;
  Kind kind;
  double lo = 0, hi = 0;             // number / integer
  std::vector<std::string> choices;  // choice
  const char* help = "";
  /// Read by test programs or scripts only (known, so no "unknown variable" warning).
  bool tooling = false;
};

/// Every variable of the table, in the order of README.md's list.
const std::vector<Var>& table();

/// Readers: the value of `name` (a table row of the matching kind), validated; `fallback`
/// when unset or empty. Errors: dtr::Error "DTR_X='v': expected ..." (one line).
bool flag(const char* name);
double number(const char* name, double fallback);
int64_t integer(const char* name, int64_t fallback);
std::string choice(const char* name);  // "" when unset

/// Parses every DTR_* variable set in the environment. Errors: the first known variable with
/// a bad value (dtr::Error, one line). Returns one warning line per DTR_* variable that the
/// table does not know (a misspelt name would otherwise be ignored without a word).
std::vector<std::string> check_environment();

}  // namespace dtr::env
