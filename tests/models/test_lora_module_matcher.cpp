// ModuleMatcher: PEFT's target_modules semantics (list: exact or "."-suffix; string: full
// match) against Python's re.fullmatch (tests/golden/module_matcher.json, made by
// tests/golden/make_module_matcher_fixture.py), and bounded time on patterns that make a
// backtracking matcher (std::regex, Python re) run for ever.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <functional>

#include "models/lora/module_matcher.h"
#include "tensor/error.h"

using namespace dtr;

namespace {

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("ModuleMatcher regex form equals Python re.fullmatch") {
  std::ifstream in("tests/golden/module_matcher.json");
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  int n = 0;
  for (const auto& c : j["cases"]) {
    const std::string p = c["pattern"], f = c["fqn"];
    INFO("pattern '" << p << "' fqn '" << f << "'");
    CHECK(ModuleMatcher::regex(p, "test").matches(f) == c["match"].get<bool>());
    ++n;
  }
  CHECK(n == 480);
}

TEST_CASE("ModuleMatcher list form: exact FQN or '.'-suffix (PEFT check_target_module_exists)") {
  const auto m = ModuleMatcher::list({"q_proj", "mlp.down_proj", "lm_head"}, "test");
  CHECK(m.matches("model.layers.0.self_attn.q_proj"));
  CHECK(m.matches("lm_head"));
  CHECK(m.matches("model.layers.3.mlp.down_proj"));
  CHECK_FALSE(m.matches("model.layers.0.self_attn.xq_proj"));  // suffix but not at a '.'
  CHECK_FALSE(m.matches("model.layers.0.self_attn.q_proj.lora_A"));
  CHECK_FALSE(m.matches("model.layers.3.xmlp.down_proj"));
  CHECK_FALSE(ModuleMatcher::list({"*_proj"}, "test").matches("model.layers.0.self_attn.q_proj"));  // no globs
}

TEST_CASE("ModuleMatcher: pathological patterns take bounded time, bad ones are clear errors") {
  const std::string fqn = "model.layers.12.self_attn.q_proj.with.a.rather.long.tail.of.components.x";
  for (const char* p : {"(.*.*)*q_projX", "(a|aa)*b", "((.*)*)*(.*)*q_projX", "(.*a){20}X", "(x+x+)+y"}) {
    INFO(p);
    bool hit = true;
    const double s = seconds_of([&] { hit = ModuleMatcher::regex(p, "test").matches(fqn); });
    CHECK_FALSE(hit);
    CHECK(s < 0.5);  // microseconds here; std::regex (dtr's matcher before) never returned
  }
  CHECK_THROWS_WITH(ModuleMatcher::regex("(a)\\1", "cfg.json"),
                    Catch::Contains("cfg.json") && Catch::Contains("not supported"));
  CHECK_THROWS_WITH(ModuleMatcher::regex("(q_proj", "cfg.json"),
                    Catch::Contains("cfg.json") && Catch::Contains("does not compile at offset 7"));
  CHECK_THROWS_WITH(ModuleMatcher::regex(std::string(70000, 'a'), "cfg.json"),
                    Catch::Contains("cfg.json") && Catch::Contains("70000 bytes"));
  CHECK_THROWS_WITH(ModuleMatcher::list({std::string(70000, 'a')}, "recipe.yaml"), Catch::Contains("recipe.yaml"));
  // What save_peft_adapter writes for an irregular selection: an alternation of every FQN
  // (here 32 layers x 7 projections, 7.6 KB).
  std::string alt;
  for (int l = 0; l < 32; ++l)
    for (const char* p : {"self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "mlp.gate", "mlp.up", "mlp.down"})
      alt += (alt.empty() ? "" : "|") + std::string("model\\.layers\\.") + std::to_string(l) + "\\." + p + "_proj";
  const auto big = ModuleMatcher::regex("(" + alt + ")", "test");
  CHECK(big.matches("model.layers.31.mlp.gate_proj"));
  CHECK_FALSE(big.matches("model.layers.32.mlp.gate_proj"));
  CHECK_FALSE(big.matches("model.layers.3.mlp.gate_proj.lora_A"));
}
