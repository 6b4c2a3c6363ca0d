#pragma once
// Philox 4x32-10 for host and device, the same rounds and constants as tensor/random.cpp, so a
// CUDA kernel draws exactly the CPU's numbers (dropout). Plain C++ when not compiled by nvcc
// (tests check it against dtr::philox_uniform on the host).
#include <cstdint>

#ifndef DTR_HOST_DEVICE
#if defined(__CUDACC__)
#define DTR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DTR_HOST_DEVICE inline
#endif
#endif

namespace dtr::cuda_ops {

/// High 32 bits of a * b.
DTR_HOST_DEVICE uint32_t philox_mulhi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

/// Word `word` (0..3) of the Philox 4x32-10 block (key = seed, counter = (counter_lo, 0)).
DTR_HOST_DEVICE uint32_t philox_word(uint64_t seed, uint64_t counter_lo, int word) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = philox_mulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = philox_mulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return word == 0 ? c0 : word == 1 ? c1 : word == 2 ? c2 : c3;
}

/// Uniform in [0, 1) for element `index` of stream `seed` (== dtr::philox_uniform): block
/// index / 4, word index % 4, top 24 bits times 2^-24.
DTR_HOST_DEVICE float philox_uniform_hd(uint64_t seed, uint64_t index) {
  return static_cast<float>(philox_word(seed, index / 4, static_cast<int>(index % 4)) >> 8) * (1.0f / 16777216.0f);
}

}  // namespace dtr::cuda_ops
