// TrainingHealth: non-finite steps stop or are skipped (bounded), a collapsed run warns once.
#include <catch2/catch.hpp>

#include <cmath>

#include "apps/train/health.h"

using dtr::train::AllRanksError;
using dtr::train::TrainingHealth;

TEST_CASE("TrainingHealth: on_nonfinite error stops at the first NaN / Inf, naming the step") {
  TrainingHealth h("error");
  CHECK(h.admit(1, 2.5, 0.7));
  CHECK_THROWS_AS(h.admit(2, NAN, 0.7), AllRanksError);
  CHECK_THROWS_WITH(h.admit(3, 2.0, INFINITY), Catch::Contains("step 3: gradient norm is inf") &&
                                                   Catch::Contains("no checkpoint written"));
  CHECK_THROWS_WITH(h.admit(4, -NAN, NAN), Catch::Contains("step 4: loss is nan"));
}

TEST_CASE("TrainingHealth: on_nonfinite skip skips, resets on a finite step, stops after the bound") {
  TrainingHealth h("skip");
  CHECK_FALSE(h.admit(1, NAN, 1.0));
  CHECK(h.admit(2, 1.0, 1.0));  // resets the run of skips
  for (int i = 0; i < TrainingHealth::kMaxConsecutiveSkips - 1; ++i) CHECK_FALSE(h.admit(3 + i, 1.0, INFINITY));
  CHECK_THROWS_WITH(h.admit(100, 1.0, INFINITY), Catch::Contains("steps in a row"));
  CHECK(h.skipped() == TrainingHealth::kMaxConsecutiveSkips + 1);
}

TEST_CASE("TrainingHealth: collapse warnings (grad norm 0, flat loss), once") {
  TrainingHealth h("error");
  for (int s = 1; s < TrainingHealth::kCollapseSteps; ++s) CHECK_FALSE(h.collapse_warning(s, 3.0 + s, 0.0));
  auto w = h.collapse_warning(TrainingHealth::kCollapseSteps, 9.0, 0.0);
  REQUIRE(w);
  CHECK(w->find("gradient norm has been 0 for 5 steps") != std::string::npos);
  CHECK_FALSE(h.collapse_warning(6, 9.0, 0.0));  // once per run
  TrainingHealth f("error");
  for (int s = 1; s < TrainingHealth::kCollapseSteps; ++s) CHECK_FALSE(f.collapse_warning(s, 4.25, 0.5));
  auto w2 = f.collapse_warning(TrainingHealth::kCollapseSteps, 4.25, 0.5);
  REQUIRE(w2);
  CHECK(w2->find("loss has stayed at 4.25 for 5 steps") != std::string::npos);
  TrainingHealth moving("error");  // a loss that moves by more than 1e-7 relative never warns
  for (int s = 1; s < 20; ++s) CHECK_FALSE(moving.collapse_warning(s, 4.0 + 1e-5 * (s % 2), 0.5));
}
