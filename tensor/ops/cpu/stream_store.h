#pragma once
// Non-temporal (streaming) f32 stores for the outputs of copy kernels that are larger than the
// caches keep (moe_permute's [N k, H] token copies, forward and as the unweighted unpermute's
// backward). A plain store first reads the line it writes (read for ownership): a 16 MB
// scattered-row copy on this project's VM took 3.4-4.0 ms with plain stores and 1.5-1.7 ms with
// non-temporal ones (one thread), and the consumer's re-read of the result cost ~0.3 ms more, as
// it comes from memory (moe_permute at the dtr-bench moe shape, 2 threads: 2.7 -> 1.4 ms for its
// two calls). Not for the SwiGLU kernels: they are compute bound (exp, divide), and streamed
// stores made them slower (1.71 -> 1.88 ms forward). The values stored are the same either way.
// Non-temporal stores are weakly ordered: a thread calls stream_fence() after its stores and
// before the data is handed to another thread (the end of its share of an OpenMP loop). Include it
// from the CPU kernel files only (one -march for all of them, so one kStreamBytes).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace dtr::cpu {

/// Outputs of at least this many bytes take the non-temporal stores (smaller ones are likely
/// still in a cache when the next op reads them).
inline constexpr int64_t kStreamOutputBytes = int64_t(8) << 20;

/// Bytes of one streaming store (the widest vector the including file is compiled for; 0: none).
#if defined(__AVX512F__)
inline constexpr int64_t kStreamBytes = 64;
#elif defined(__AVX__)
inline constexpr int64_t kStreamBytes = 32;
#else
inline constexpr int64_t kStreamBytes = 0;
#endif

/// dst[0, n) = src[0, n): non-temporal stores on the part of dst aligned to kStreamBytes when
/// `stream`, plain copies for the rest (and without `stream`).
inline void copy_floats(float* dst, const float* src, int64_t n, bool stream) {
#if defined(__AVX512F__) || defined(__AVX__)
  if (stream && n * 4 >= 2 * kStreamBytes) {
    constexpr int64_t L = kStreamBytes / 4;
    const int64_t head = std::min<int64_t>(n, ((kStreamBytes - reinterpret_cast<uintptr_t>(dst) % kStreamBytes) %
                                               kStreamBytes) / 4);
    std::copy(src, src + head, dst);
    int64_t i = head;
    for (; i + L <= n; i += L) {
#if defined(__AVX512F__)
      _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#else
      _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#endif
    }
    std::copy(src + i, src + n, dst + i);
    return;
  }
#endif
  std::copy(src, src + n, dst);
}

/// Orders this thread's non-temporal stores before its later stores (call before the results
/// are read by another thread).
inline void stream_fence() { _mm_sfence(); }

}  // namespace dtr::cpu
