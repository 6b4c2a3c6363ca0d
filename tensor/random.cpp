#include "tensor/random.h"

#include <cmath>

namespace dtr {
namespace {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
GeneratorState g_state;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace

std::array<uint32_t, 4> philox4x32_10(uint64_t seed, uint64_t counter_lo, uint64_t counter_hi) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c0, hi0, lo0);
    mulhilo(kMul1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

float philox_uniform(uint64_t seed, uint64_t index) {
  // One block per 4 elements; element index picks its word.
  const auto b = philox4x32_10(seed, index / 4);
  return static_cast<float>(b[index % 4] >> 8) * (1.0f / 16777216.0f);
}

float philox_normal(uint64_t seed, uint64_t index) {
  // Each element uses its own block (counter_hi = 1 separates it from the uniform stream).
  const auto b = philox4x32_10(seed, index, 1);
  const double u1 = (static_cast<double>(b[0]) + 1.0) / 4294967297.0;  // (0, 1]
  const double u2 = static_cast<double>(b[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void manual_seed(uint64_t seed) { g_state = {seed, 0}; }
GeneratorState generator_state() { return g_state; }
void set_generator_state(GeneratorState s) { g_state = s; }
uint64_t reserve_random_offsets(uint64_t n) {
  const uint64_t o = g_state.offset;
  g_state.offset += n;
  return o;
}

}  // namespace dtr
