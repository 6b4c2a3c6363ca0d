// bench/cpu_peak.h: the FMA units per core that dtr-bench cpu-peak takes as documented. Skylake-SP /
// Cascade Lake SKUs differ (Intel ARK's "# of AVX-512 FMA Units"): the model name decides, and a name
// that names no SKU leaves the count to be inferred.
#include <catch2/catch.hpp>

#include "bench/cpu_peak.h"

using dtr::bench::documented_fma_units;

namespace {
int zmm_of(const std::string& model_name, int model = 85) {
  const auto f = documented_fma_units("GenuineIntel", 6, model, model_name);
  REQUIRE(f.has_value());
  return f->zmm;
}
}  // namespace

TEST_CASE("cpu-peak: Skylake-SP / Cascade Lake AVX-512 FMA units by SKU", "[bench]") {
  CHECK(zmm_of("Intel(R) Xeon(R) Platinum 8180 CPU @ 2.50GHz") == 2);
  CHECK(zmm_of("Intel(R) Xeon(R) Platinum 8280L CPU @ 2.70GHz") == 2);
  CHECK(zmm_of("Intel(R) Xeon(R) Platinum 9242 CPU @ 2.30GHz") == 2);
  CHECK(zmm_of("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz") == 2);
  CHECK(zmm_of("Intel(R) Xeon(R) Gold 6230R CPU @ 2.10GHz") == 2);
  CHECK(zmm_of("Intel(R) Xeon(R) Gold 5118 CPU @ 2.30GHz") == 1);
  CHECK(zmm_of("Intel(R) Xeon(R) Gold 5218 CPU @ 2.30GHz") == 1);
  CHECK(zmm_of("Intel(R) Xeon(R) Gold 5122 CPU @ 3.60GHz") == 2);
  CHECK(zmm_of("Intel(R) Xeon(R) Gold 5222 CPU @ 3.80GHz") == 2);
  CHECK(zmm_of("Intel(R) Xeon(R) Silver 4114 CPU @ 2.20GHz") == 1);
  CHECK(zmm_of("Intel(R) Xeon(R) Silver 4210R CPU @ 2.40GHz") == 1);
  CHECK(zmm_of("Intel(R) Xeon(R) Bronze 3204 CPU @ 1.90GHz") == 1);
  const auto silver = documented_fma_units("GenuineIntel", 6, 85, "Intel(R) Xeon(R) Silver 4114 CPU @ 2.20GHz");
  CHECK(silver->ymm == 2);
  CHECK(silver->basis == "documented for the Xeon Silver 4114 (Skylake-SP / Cascade Lake (Xeon Scalable 1st/2nd gen))");
  // A VM's model name names no SKU: not decided (the caller infers it from the measured rate).
  const auto vm = documented_fma_units("GenuineIntel", 6, 85, "Intel(R) Xeon(R) Processor");
  CHECK(vm->zmm == 0);
  CHECK(vm->ymm == 2);
  CHECK(vm->basis.find("1 or 2 by SKU, and the model name 'Intel(R) Xeon(R) Processor' names none") != std::string::npos);
}

TEST_CASE("cpu-peak: the other microarchitectures by cpuid family / model", "[bench]") {
  CHECK(zmm_of("Intel(R) Xeon(R) Processor", 207) == 2);  // Emerald Rapids: every SKU
  CHECK(zmm_of("Intel(R) Xeon(R) Silver 4310 CPU @ 2.10GHz", 106) == 2);  // Ice Lake-SP: every SKU
  const auto zen4 = documented_fma_units("AuthenticAMD", 25, 17, "AMD EPYC 9654 96-Core Processor");
  REQUIRE(zen4.has_value());
  CHECK(zen4->zmm == 1);
  CHECK(zen4->ymm == 2);
  CHECK_FALSE(documented_fma_units("GenuineIntel", 6, 62, "Intel(R) Xeon(R) CPU E5-2670 v2").has_value());
}
