#pragma once
// Counter-based random numbers: Philox 4x32-10 (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC 2011). Every number is a pure function of (seed, counter), so element
// i of a random tensor is addressed by (seed, offset + i): a shard generates exactly its
// slice of the global tensor, on any mesh.
#include <array>
#include <cstdint>

namespace dtr {

/// One Philox 4x32-10 block: 4 x 32 random bits from (key = seed, counter).
std::array<uint32_t, 4> philox4x32_10(uint64_t seed, uint64_t counter_lo, uint64_t counter_hi = 0);

/// Uniform float in [0, 1) for element `index` of stream (seed, stream_offset); 24 bits.
float philox_uniform(uint64_t seed, uint64_t index);
/// Standard normal for element `index` (Box-Muller on the block's first two words).
float philox_normal(uint64_t seed, uint64_t index);

/// The process-wide generator state: a seed and an offset that advances by the number of
/// elements each random op draws. Dropout and init take (seed, offset) from here.
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};
/// Sets the seed and resets the offset to 0 (torch.manual_seed).
void manual_seed(uint64_t seed);
GeneratorState generator_state();
void set_generator_state(GeneratorState s);
/// Reserves `n` consecutive element offsets and returns the first.
uint64_t reserve_random_offsets(uint64_t n);

/// Sets the generator to `s` for its lifetime and restores the state it found (activation
/// checkpointing recomputes with the forward's stream without disturbing training's).
class GeneratorStateGuard {
 public:
  explicit GeneratorStateGuard(GeneratorState s) : prev_(generator_state()) { set_generator_state(s); }
  ~GeneratorStateGuard() { set_generator_state(prev_); }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  GeneratorState prev_;
};

}  // namespace dtr
