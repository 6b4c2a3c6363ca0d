#pragma once
// ISA-independent pieces of dtr's packed SGEMMs (the AVX-512 one of sgemm.h, the AVX2 one of
// sgemm_avx2.h): the problem description, packing scratch, the thread split.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "tensor/error.h"

namespace dtr::cpu::sgemm_detail {

/// Grow-only 64-byte aligned scratch (one per thread and role; reused across calls). Not counted
/// by memory_stats(): per worker the packed B of a K block (kc x up to 2048 floats, kc <= 640)
/// and the packed A of a row chunk (up to 8 x 14 x kc floats); in a column split the packed A
/// of one K block (m x kc floats), on the calling thread for the AVX-512 kernel and per worker
/// for the AVX2 one. get() throws dtr::Error when out of memory;
/// get_in_parallel() is for OpenMP workers, where an exception cannot leave the region: it
/// prints the same message and aborts. `owner` names the kernel in that message.
struct Scratch {
  float* p = nullptr;
  size_t cap = 0;
  const char* owner = "sgemm";
  float* try_get(size_t n) {
    if (n > cap) {
      std::free(p);
      cap = 0;
      p = static_cast<float*>(std::aligned_alloc(64, bytes_of(n)));
      if (p) cap = n;
    }
    return p;
  }
  float* get(size_t n) {
    float* q = try_get(n);
    DTR_CHECK(q != nullptr, owner, ": out of memory for a ", bytes_of(n), "-byte scratch buffer");
    return q;
  }
  float* get_in_parallel(size_t n) {
    float* q = try_get(n);
    if (!q) {
      std::fprintf(stderr, "dtr: error: %s: out of memory for a %zu-byte scratch buffer\n", owner, bytes_of(n));
      std::abort();
    }
    return q;
  }
  static size_t bytes_of(size_t n) { return (n * sizeof(float) + 63) / 64 * 64; }
  ~Scratch() { std::free(p); }
};

/// [begin, end) of part t of `total` items split into T contiguous, balanced parts.
inline std::pair<int64_t, int64_t> part(int64_t total, int T, int t) { return {total * t / T, total * (t + 1) / T}; }

/// One C (+)= A * B call (the arguments of sgemm()).
struct Problem {
  int64_t m, n, k;
  const float* A;
  int64_t a_rs, a_cs;
  const float* B;
  int64_t b_rs, b_cs;
  float* C;
  int64_t ldc;
  bool accumulate;
};

}  // namespace dtr::cpu::sgemm_detail
