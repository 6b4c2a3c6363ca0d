// compare_metrics A.jsonl B.jsonl [--from S] [--to E] [--rtol R] [--key loss]
// Compares the `key` values of the steps S..E (inclusive; default all steps of A) of two
// dtr-train metrics files. Prints each pair and the largest relative difference; exit 0 when
// every |a - b| <= rtol * max(|a|, |b|) (rtol 0 = bitwise equal), 1 otherwise.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

static std::map<long, double> read(const char* path, const std::string& key) {
  std::map<long, double> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains(key)) out[j["step"].get<long>()] = j[key].get<double>();
  }
  return out;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: compare_metrics A.jsonl B.jsonl [--from S] [--to E] [--rtol R] [--key loss]\n");
    return 2;
  }
  long from = 1, to = -1;
  double rtol = 0;
  std::string key = "loss";
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--from")) from = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--to")) to = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rtol")) rtol = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--key")) key = argv[i + 1];
  }
  auto a = read(argv[1], key), b = read(argv[2], key);
  if (a.empty()) {
    std::fprintf(stderr, "compare_metrics: no '%s' values in %s\n", key.c_str(), argv[1]);
    return 1;
  }
  if (to < 0) to = a.rbegin()->first;
  double worst = 0;
  int n = 0;
  bool ok = true;
  for (long s = from; s <= to; ++s) {
    if (!a.count(s) || !b.count(s)) {
      if (key != "loss") continue;
      std::fprintf(stderr, "compare_metrics: step %ld missing in %s\n", s, a.count(s) ? argv[2] : argv[1]);
      return 1;
    }
    const double x = a[s], y = b[s];
    const double rel = x == y ? 0 : std::fabs(x - y) / std::max(std::fabs(x), std::fabs(y));
    worst = std::max(worst, rel);
    ok = ok && rel <= rtol;
    ++n;
    std::printf("step %3ld  %.9g  %.9g  rel %.3g\n", s, x, y, rel);
  }
  std::printf("%s: %d steps, max relative difference %.3g (rtol %.3g)\n", ok ? "OK" : "MISMATCH", n, worst, rtol);
  return ok && n > 0 ? 0 : 1;
}
