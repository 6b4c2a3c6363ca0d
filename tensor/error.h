#pragma once
// dtr::Error and the DTR_CHECK macro: the one error type of dtr, thrown with context.
#include <cstdint>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtr {

/// The single exception type of dtr. Messages name the op / key / file, what came and what
/// was expected; apps print them as one line and exit non-zero.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Prints a shape as [2, 3, 4].
std::ostream& operator<<(std::ostream& os, const std::vector<int64_t>& v);

namespace detail {
template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}
}  // namespace detail

}  // namespace dtr

/// Throws dtr::Error with the concatenated message parts when `cond` is false.
#define DTR_CHECK(cond, ...)                                     \
  do {                                                           \
    if (!(cond)) throw ::dtr::Error(::dtr::detail::cat(__VA_ARGS__)); \
  } while (0)

/// Throws dtr::Error with the concatenated message parts.
#define DTR_ERROR(...) throw ::dtr::Error(::dtr::detail::cat(__VA_ARGS__))
