#pragma once
// dtr's own f32 GEMM for AVX-512 CPUs: C[m,n] (+)= A[m,k] * B[k,n] over strided operands. The
// packed path is in sgemm.cpp, the skinny paths in sgemm_skinny.cpp, shared pieces in
// sgemm_internal.h.
//
// Goto/BLIS-style (K. Goto and R. van de Geijn, "Anatomy of High-Performance Matrix
// Multiplication", ACM TOMS 34(3), 2008; F. Van Zee and R. van de Geijn, "BLIS", ACM TOMS
// 41(3), 2015): K is cut into blocks of at most 640 (one block when K <= 640, so C is written
// once, e.g. the lm_head product with K = 576); per K block A is packed into 14-row panels
// (row i of the panel at [p*14 + i]) and B into 32-column panels ([p*32 + j], zero padded) of
// at most 2048 columns at a time; a 14x32 register tile (28 zmm accumulators, one broadcast
// from A and two loads from B per k) does the FMAs. Loop nest per thread: 256-column B
// sub-block (kc x 256, L2 resident) > 14-row A panel (kc x 14 <= 35 KB, L1 resident) >
// 32-column B panel; when a thread's packed B of the K block fits 3/4 of the L2 (n <= ~576 at kc
// 512 on a 2 MB L2: weight gradients, lm_head's tall dW / dX) it is all one sub-block and each A
// panel is packed just before its use instead (A read once from its source, no m x kc packed
// copy). Threads split the row panels (each packs all of B and the A panels it takes, no barrier:
// items of (K block, row chunk) from one counter in K order, a chunk taking block b + 1 only after
// its block b finished) or, for a very wide B (lm_head forward) or few rows, the column panels (A
// packed by all into one buffer, column chunks from a counter, two barriers per K block); see
// sgemm_schedule.h: a core slowed by another tenant of the machine takes fewer chunks instead of
// holding the other threads at the join (measured in-process, old static halves vs chunks
// alternating call by call, 2 threads, 2026-12-02: +3..+25% mean GFLOP/s on the layer and
// lm_head shapes). Edge rows use a kernel
// instantiated for that row count, edge columns masked loads/stores of C; a C of 16 MB or more
// written in one K block (lm_head) goes out with non-temporal stores. Packing transposes 16x16
// blocks in registers where the source layout needs it. Skinny products (LoRA rank 8) are
// memory bound and skip the packing of the big operand: n <= 16 with row-major A: dot products
// along k against B^T (k cut into chunks whose B^T slice is 16 KB when all of B^T would not fit
// 32 KB of L1 beside the streaming A rows, 16 rows at a time, the lane sums kept in between); m <= 8 with row-major B, or n <= 8 with column-major A (solved as
// C^T = B^T A^T): 8x48 tiles streaming B row by row with software prefetch; other n <= 16: one
// masked zmm of C per row.
//
// Blocking choices measured in-process (alternating variants call by call, 1 thread, 30 calls per
// variant, thread CPU time: the machine is shared; 2026-12-01): K blocks of 256, 320 or 384
// instead of 640 (A and B panels then within L1), a software prefetch of C's tile before the
// accumulate of later K blocks, and one of the second 64-byte line of each packed B row (the
// kernel prefetches the first, 8 k ahead; the hardware prefetcher covers the other) were all
// within +-5% on the layer, square and weight-gradient shapes (no change made); a non-temporal
// (NTA) B prefetch ran 0.47x on n = 1536 (B left the L2).
//
// Determinism: each C element is computed in a fixed order (an FMA chain over k per K block,
// the blocks added to C in K order, possibly by different threads, handed over by the
// TileQueue's release / acquire or a barrier; in the dot path one chain per lane, then a fixed
// horizontal sum), and the path and blocking depend only on the shape and layout, the K
// blocking on k alone, so results are bitwise identical for any thread count and a row range
// of C computed alone has the bits of the whole product.
#include <cstdint>

namespace dtr::cpu {

/// True when this build has the AVX-512 SGEMM (compiled with __AVX512F__).
bool sgemm_available();

/// C[m,n] (+)= A[m,k] * B[k,n] in f32. A(i,p) = A[i*a_rs + p*a_cs], B(p,j) = B[p*b_rs + j*b_cs]
/// (any strides; one unit stride per operand is the fast case), C(i,j) = C[i*ldc + j] with
/// ldc >= n. accumulate: C += A*B (beta 1), else C = A*B (beta 0; C need not be initialised).
/// k == 0 gives C = 0 (or leaves C unchanged when accumulating). Parallel inside with OpenMP up
/// to omp_get_max_threads() unless called from a parallel region (then single-threaded);
/// results do not depend on the thread count. Throws dtr::Error when the build lacks AVX-512.
void sgemm(int64_t m, int64_t n, int64_t k, const float* A, int64_t a_rs, int64_t a_cs, const float* B,
           int64_t b_rs, int64_t b_cs, float* C, int64_t ldc, bool accumulate);

}  // namespace dtr::cpu
