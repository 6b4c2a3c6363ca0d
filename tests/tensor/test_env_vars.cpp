// The DTR_* environment table: every value is parsed by check_environment with a one-line error
// naming the variable; unknown DTR_* names give a warning; the typed readers agree.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "tensor/env_vars.h"
#include "tensor/error.h"

using namespace dtr;

namespace {

/// Sets `name` for the scope of the object, restoring the previous value.
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char* n, const char* v) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    setenv(n, v, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

std::string error_of(const char* name, const char* value) {
  ScopedEnv e(name, value);
  try {
    (void)env::check_environment();
  } catch (const Error& err) {
    return err.what();
  }
  return "";
}

}  // namespace

TEST_CASE("env: bad values are one-line errors naming the variable") {
  struct Case {
    const char* name;
    const char* value;
    const char* expect;
  };
  for (const Case& c : {Case{"DTR_COMM_TIMEOUT_S", "abc", "a number in [0.001, 3.1536e+07]"},
                        Case{"DTR_COMM_TIMEOUT_S", "0", "a number"}, Case{"DTR_COMM_TIMEOUT_S", "-5", "a number"},
                        Case{"DTR_COMM_TIMEOUT_S", "inf", "a number"}, Case{"DTR_COMM_TIMEOUT_S", "nan", "a number"},
                        Case{"DTR_COMM_TIMEOUT_S", "1e400", "a number"}, Case{"DTR_COMM_TIMEOUT_S", "5s", "a number"},
                        Case{"DTR_NUM_THREADS", "0", "an integer in [1, 4096]"},
                        Case{"DTR_NUM_THREADS", "2.5", "an integer"}, Case{"DTR_CPU_CACHE_MB", "-1", "an integer"},
                        Case{"DTR_CPU_CACHE_MB", "99999999999999999999", "an integer"},
                        Case{"DTR_BACKEND", "gloo", "mpi or nccl"}, Case{"DTR_COMM_DEBUG", "yes", "0 or 1"},
                        Case{"DTR_EIGEN_SGEMM", "2", "0 or 1"},
                        Case{"DTR_SGEMM", "avx3", "avx512 or avx2 or eigen"}}) {
    const std::string msg = error_of(c.name, c.value);
    INFO(c.name << "=" << c.value << " -> " << msg);
    CHECK(msg.rfind(std::string(c.name) + "='" + c.value + "'", 0) == 0);
    CHECK(msg.find(c.expect) != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("env: good values parse, the readers return them") {
  {
    ScopedEnv e("DTR_COMM_TIMEOUT_S", "2.5");
    CHECK(env::check_environment().empty());
    CHECK(env::number("DTR_COMM_TIMEOUT_S", 600) == 2.5);
  }
  {
    ScopedEnv e("DTR_COMM_TIMEOUT_S", "");  // empty = unset: the default
    CHECK(env::number("DTR_COMM_TIMEOUT_S", 600) == 600);
  }
  {
    ScopedEnv e("DTR_CPU_CACHE_MB", "0");
    CHECK(env::integer("DTR_CPU_CACHE_MB", 7) == 0);
  }
  {
    ScopedEnv e("DTR_DTENSOR_DEBUG", "");
    CHECK_FALSE(env::flag("DTR_DTENSOR_DEBUG"));
  }
  {
    ScopedEnv e("DTR_DTENSOR_DEBUG", "1");
    CHECK(env::flag("DTR_DTENSOR_DEBUG"));
  }
  {
    ScopedEnv e("DTR_BACKEND", "mpi");
    CHECK(env::choice("DTR_BACKEND") == "mpi");
  }
  // A reader of a name the table does not hold is a programming error, said so.
  CHECK_THROWS_WITH(env::flag("DTR_NO_SUCH"), Catch::Contains("not a table row"));
}

TEST_CASE("env: an unknown DTR_ variable is a warning naming it and the known ones") {
  ScopedEnv e("DTR_COMM_TIMEOUT", "5");  // misspelt DTR_COMM_TIMEOUT_S
  const auto w = env::check_environment();
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("unknown environment variable DTR_COMM_TIMEOUT ") != std::string::npos);
  CHECK(w[0].find("DTR_COMM_TIMEOUT_S") != std::string::npos);
}
