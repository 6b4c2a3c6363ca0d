// The libFuzzer corpus as a regression test: every file of tests/fuzz_corpus/<target>/ goes
// through the same parser entry point as the fuzz target (fuzz/targets.h) and must load or throw
// dtr::Error: no other exception, no crash (and no sanitizer report in a sanitizer build).
// The corpus was minimised with libFuzzer -merge=1; see models/README.md to extend it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include "fuzz/targets.h"
#include "models/test_util.h"

using namespace dtr;
namespace fs = std::filesystem;

TEST_CASE("fuzz corpus: every input loads or throws dtr::Error", "[fuzz][corpus]") {
  for (const auto& name : fuzz::target_names()) {
    const fs::path dir = fs::path("tests/fuzz_corpus") / name;
    INFO("target " << name);
    REQUIRE(fs::is_directory(dir));
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    CHECK(!files.empty());
    int loaded = 0, rejected = 0;
    for (const auto& f : files) {
      INFO("input " << f.string());
      bool ok = false;
      CHECK_NOTHROW(ok = fuzz::run_target(name, test::read_bytes(f.string())));
      (ok ? loaded : rejected)++;
    }
    // Both outcomes must be covered by a useful corpus.
    CHECK(loaded > 0);
    CHECK(rejected > 0);
    WARN(name << ": " << files.size() << " inputs, " << loaded << " load, " << rejected << " rejected with dtr::Error");
  }
}

TEST_CASE("fuzz seeds: the valid inputs built by dtr's writers load", "[fuzz][corpus]") {
  for (const auto& name : fuzz::target_names()) {
    INFO("target " << name);
    const auto seeds = fuzz::seed_inputs(name);
    CHECK(!seeds.empty());
    for (const auto& s : seeds) CHECK(fuzz::run_target(name, s));
  }
  CHECK_THROWS_AS(fuzz::run_target("no_such_target", ""), std::invalid_argument);
}
