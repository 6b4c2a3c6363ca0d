#pragma once
// dtr's packed f32 GEMM for AVX2 + FMA CPUs (no AVX-512: e.g. AMD EPYC Zen 2 / Zen 3), the ymm
// twin of the AVX-512 packed path of sgemm.h: the same Goto/BLIS blocking (K blocks of at most
// 384; A packed into 6-row panels, B into 16-column panels, 1024 columns at a time; a 6x16
// register tile of 12 ymm accumulators, one broadcast from A and two loads from B per k; loop
// nest per thread: 128-column B sub-block (L2) > 6-row A panel (L1) > 16-column B panel) and
// the same thread split (row panels, or column panels for a wide B or few rows), handed out as
// items (K block, chunk of panels) from one counter in K order (sgemm_schedule.h's TileQueue, no
// barrier; a core slowed by another tenant takes fewer; the column split packs all of A per
// thread and K block, the AVX-512 one shares it).
// Edge tiles go through a 6x16 buffer. Every shape takes
// the packed path (no skinny special cases). Compiled with -march=x86-64-v3 whatever the
// kernel architecture, so an AVX-512 build can run it too (DTR_SGEMM=avx2 or avx2+eigen, for
// tests and dtr-bench gemm). Without AVX-512, gemm.cpp runs it where avx2_kernel_preferred()
// (k <= 64 or m <= 8) and Eigen elsewhere. Deterministic like sgemm.h: each C element is one FMA chain per K block in a
// fixed order, independent of the thread count.
#include <cstdint>

namespace dtr::cpu {

/// True when this build has the AVX2 kernel and the CPU running it supports AVX2 and FMA.
bool sgemm_avx2_available();

/// C[m,n] (+)= A[m,k] * B[k,n] in f32, the contract of sgemm() (sgemm.h): any strides,
/// C(i,j) = C[i*ldc + j], ldc >= n, accumulate = beta 1. Parallel inside with OpenMP unless
/// called from a parallel region. Throws dtr::Error when sgemm_avx2_available() is false.
void sgemm_avx2(int64_t m, int64_t n, int64_t k, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
                int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);

}  // namespace dtr::cpu
