// Philox 4x32-10: known answers from Random123, the slice property (any slice of a global
// random tensor can be generated alone from (seed, offset + global index)), statistics.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors", "[random]") {
  // Random123 tests/kat_vectors, philox4x32 10 rounds: (counter words c0..c3, key k0 k1).
  // Our API packs counter_lo = c0 | c1 << 32, counter_hi = c2 | c3 << 32, seed = k0 | k1 << 32.
  using A = std::array<uint32_t, 4>;
  CHECK(philox4x32_10(0, 0, 0) == A{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(philox4x32_10(~0ull, ~0ull, ~0ull) == A{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  // Counter / key from the digits of pi.
  CHECK(philox4x32_10(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull) ==
        A{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("uniform/normal elements are pure functions of (seed, offset + index)", "[random]") {
  manual_seed(1234);
  CHECK(generator_state().offset == 0);
  const Shape global{6, 10};
  Tensor full_u = uniform(global, -2.0, 3.0, TensorOptions(DType::f64));
  CHECK(generator_state().offset == 60);  // the offset advances by numel
  SECTION("a rectangular slice equals the per-element formula") {
    Tensor s = full_u.narrow(0, 2, 3).narrow(1, 4, 5);
    auto v = s.to_vector<double>();
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < 5; ++c) {
        const uint64_t idx = static_cast<uint64_t>((r + 2) * 10 + (c + 4));
        CHECK(v[static_cast<size_t>(r * 5 + c)] == -2.0 + 5.0 * static_cast<double>(philox_uniform(1234, idx)));
      }
  }
  SECTION("a row block generated alone at its offset equals the narrowed global tensor") {
    set_generator_state({1234, 2 * 10});
    Tensor rows = uniform({3, 10}, -2.0, 3.0, TensorOptions(DType::f64));
    CHECK(rows.to_vector<double>() == full_u.narrow(0, 2, 3).to_vector<double>());
  }
  SECTION("normal too") {
    manual_seed(99);
    Tensor n = normal({4, 4}, 1.0, 2.0, TensorOptions(DType::f64));
    set_generator_state({99, 8});
    Tensor tail = normal({2, 4}, 1.0, 2.0, TensorOptions(DType::f64));
    CHECK(tail.to_vector<double>() == n.narrow(0, 2, 2).to_vector<double>());
    CHECK(n.to_vector<double>()[5] == 1.0 + 2.0 * static_cast<double>(philox_normal(99, 5)));
  }
}

TEST_CASE("seeds and offsets give different streams, same seed repeats", "[random]") {
  manual_seed(5);
  auto a = rand({100}).to_vector<float>();
  auto b = rand({100}).to_vector<float>();
  manual_seed(5);
  auto a2 = rand({100}).to_vector<float>();
  manual_seed(6);
  auto c = rand({100}).to_vector<float>();
  CHECK(a == a2);
  CHECK(a != b);
  CHECK(a != c);
  for (float x : a) {
    CHECK(x >= 0.0f);
    CHECK(x < 1.0f);
  }
}

TEST_CASE("large randn and rand have the expected moments", "[random]") {
  manual_seed(2024);
  constexpr int64_t n = 1 << 18;
  // 6 standard errors: a false failure has probability ~2e-9 (and the stream is fixed anyway).
  const double se = 6.0 / std::sqrt(static_cast<double>(n));
  auto z = randn({n}, TensorOptions(DType::f64)).to_vector<double>();
  double s = 0, s2 = 0, s4 = 0;
  for (double x : z) {
    s += x;
    s2 += x * x;
    s4 += x * x * x * x;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  CHECK(std::abs(mean) < se);
  CHECK(std::abs(var - 1.0) < se * std::sqrt(2.0));  // Var(x^2) = 2 for a standard normal
  CHECK(std::abs(s4 / n - 3.0) < se * std::sqrt(96.0));  // Var(x^4) = 105 - 9 = 96
  auto u = rand({n}, TensorOptions(DType::f64)).to_vector<double>();
  double su = 0, su2 = 0;
  for (double x : u) {
    su += x;
    su2 += x * x;
  }
  CHECK(std::abs(su / n - 0.5) < se * std::sqrt(1.0 / 12.0));
  CHECK(std::abs(su2 / n - 1.0 / 3.0) < se * std::sqrt(4.0 / 45.0));  // Var(u^2) = 1/5 - 1/9
}
