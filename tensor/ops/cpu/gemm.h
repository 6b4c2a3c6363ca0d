#pragma once
// CPU GEMM over strided memory (f32: dtr's AVX-512 sgemm.h when built for AVX-512, else Eigen;
// f64: Eigen): C[m,n] (+)= A[m,k] * B[k,n] where A and B may be transposed views (either stride
// may be 1); no copy is made for transposes.
#include <cstdint>

namespace dtr::cpu {

/// One GEMM. lda_row/lda_col: element strides of A's rows / columns (one of them must be 1 or
/// belong to a size-1 dim, otherwise the caller copies). C is row-major contiguous with row
/// stride n. When `accumulate` C += A*B, else C = A*B. Parallel inside (OpenMP) unless called
/// from an OpenMP parallel region. The f32 AVX-512 path's results do not depend on the thread count;
/// DTR_EIGEN_SGEMM=1 in the environment sends f32 to Eigen instead (A/B benchmarks).
template <class T>
void gemm(int64_t m, int64_t n, int64_t k, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
          int64_t b_cs, T* C, bool accumulate);

}  // namespace dtr::cpu
