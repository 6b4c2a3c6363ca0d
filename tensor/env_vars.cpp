// The DTR_* environment variables (see env_vars.h).
#include "tensor/env_vars.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "tensor/error.h"

extern char** environ;

namespace dtr::env {
namespace {

const Var* find(const std::string& name) {
  for (const auto& v : table())
    if (name == v.name) return &v;
  return nullptr;
}

const Var& row(const char* name, Kind kind) {
  const Var* v = find(name);
  DTR_CHECK(v && v->kind == kind, "env: ", name, " is not a table row of this kind (tensor/env_vars.cpp)");
  return *v;
}

std::string num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "" : sep) + e;
  return s;
}

/// Parses `text` as the variable `v` says; throws the one-line error otherwise. Returns the
/// numeric value for number / integer / flag rows (0 / 1), 0 otherwise.
double parse(const Var& v, const std::string& text) {
  const std::string head = std::string(v.name) + "='" + text + "': expected ";
  switch (v.kind) {
    case Kind::flag:
      DTR_CHECK(text.empty() || text == "0" || text == "1", head, "0 or 1 (", v.help, ")");
      return text == "1" ? 1 : 0;
    case Kind::number: {
      char* end = nullptr;
      errno = 0;
      const double x = std::strtod(text.c_str(), &end);
      DTR_CHECK(!text.empty() && end && *end == '\0' && errno == 0 && std::isfinite(x) && x >= v.lo && x <= v.hi,
                head, "a number in [", num(v.lo), ", ", num(v.hi), "] (", v.help, ")");
      return x;
    }
    case Kind::integer: {
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(text.c_str(), &end, 10);
      DTR_CHECK(!text.empty() && end && *end == '\0' && errno == 0 && static_cast<double>(x) >= v.lo &&
                    static_cast<double>(x) <= v.hi,
                head, "an integer in [", num(v.lo), ", ", num(v.hi), "] (", v.help, ")");
      return static_cast<double>(x);
    }
    case Kind::choice:
      for (const auto& c : v.choices)
        if (text == c) return 0;
      DTR_ERROR(head, join(v.choices, " or "), " (", v.help, ")");
    case Kind::text:
      return 0;
  }
  return 0;
}

/// The value of `name`, or nullptr when unset or empty.
const char* raw(const char* name) {
  const char* s = std::getenv(name);
  return s && *s ? s : nullptr;
}

}  // namespace

const std::vector<Var>& table() {
  static const std::vector<Var> t = {
      {"DTR_NUM_THREADS", Kind::integer, 1, 4096, {}, "CPU threads per rank; default cores / local ranks"},
      {"DTR_COMM_TIMEOUT_S", Kind::number, 1e-3, 31536000, {},
       "seconds a collective, barrier or blocking MPI call may wait before the job aborts; default 600"},
      {"DTR_COMM_DEBUG", Kind::flag, 0, 0, {}, "check collective shapes across ranks first"},
      {"DTR_DTENSOR_DEBUG", Kind::flag, 0, 0, {}, "log every implicit redistribution"},
      {"DTR_BACKEND", Kind::choice, 0, 0, {"mpi", "nccl"}, "collective backend of CUDA meshes"},
      {"DTR_PROGRESS", Kind::choice, 0, 0, {"auto", "bar", "lines"},
       "dtr-train's progress display when --progress is not given; default auto"},
      {"DTR_CPU_CACHE_MB", Kind::integer, 0, 1073741824.0, {},
       "cap of the host memory block cache in MiB; default 2048, 0 turns it off"},
      {"DTR_CPU_ALLOC_POISON", Kind::flag, 0, 0, {}, "fill every host allocation with NaN bytes"},
      {"DTR_EIGEN_SGEMM", Kind::flag, 0, 0, {}, "f32 GEMM on Eigen instead of dtr's AVX-512 kernel"},
      {"DTR_SGEMM", Kind::choice, 0, 0, {"avx512", "avx2", "eigen", "avx2+eigen"},
       "f32 GEMM kernel (default: avx512 where the build and CPU have it, else avx2+eigen per shape)"},
      {"DTR_ALLOW_TF32", Kind::flag, 0, 0, {}, "TF32 for f32 GEMMs on CUDA"},
      {"DTR_CUDA_SDPA_SIMPLE", Kind::flag, 0, 0, {}, "CUDA-core attention kernel instead of the tensor-core one"},
      {"DTR_TEST_REQUIRE_CUDA", Kind::flag, 0, 0, {}, "tests: fail instead of skipping without a GPU", true},
      {"DTR_FUZZ_ITERS", Kind::integer, 0, 1e12, {}, "tests: iterations of the parser fuzz test", true},
      {"DTR_PEFT_EXPORT_DIR", Kind::text, 0, 0, {}, "tests: keep the exported PEFT adapter here", true},
      {"DTR_BUILD_DIR", Kind::text, 0, 0, {}, "bench/compare/run.sh: build directory", true},
      {"DTR_BENCH_VENV", Kind::text, 0, 0, {}, "bench/compare/run.sh: Python venv", true},
  };
  return t;
}

bool flag(const char* name) {
  const Var& v = row(name, Kind::flag);
  const char* s = raw(name);
  return s && parse(v, s) != 0;
}

double number(const char* name, double fallback) {
  const Var& v = row(name, Kind::number);
  const char* s = raw(name);
  return s ? parse(v, s) : fallback;
}

int64_t integer(const char* name, int64_t fallback) {
  const Var& v = row(name, Kind::integer);
  const char* s = raw(name);
  return s ? static_cast<int64_t>(parse(v, s)) : fallback;
}

std::string choice(const char* name) {
  const Var& v = row(name, Kind::choice);
  const char* s = raw(name);
  if (!s) return "";
  parse(v, s);
  return s;
}

std::vector<std::string> check_environment() {
  std::vector<std::string> warnings;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (std::strncmp(*e, "DTR_", 4) != 0 || !eq) continue;
    const std::string name(*e, static_cast<size_t>(eq - *e)), value(eq + 1);
    if (const Var* v = find(name)) {
      if (!value.empty()) parse(*v, value);
      continue;
    }
    std::vector<std::string> known;
    for (const auto& v : table())
      if (!v.tooling) known.push_back(v.name);
    warnings.push_back("unknown environment variable " + name + " (ignored; dtr reads " + join(known, ", ") + ")");
  }
  return warnings;
}

}  // namespace dtr::env
