#pragma once
// CPU GEMM over strided memory (f32: dtr's AVX-512 sgemm.h when built for AVX-512; without it,
// per shape, the AVX2 twin sgemm_avx2.h or Eigen; f64: Eigen): C[m,n] (+)= A[m,k] * B[k,n] where A
// and B may be transposed views (either stride may be 1); no copy is made for transposes.
#include <cstdint>

namespace dtr::cpu {

/// The f32 GEMM kernel gemm<float> uses: DTR_SGEMM=avx512|avx2|eigen|avx2+eigen in the
/// environment (read once; DTR_EIGEN_SGEMM=1 = eigen), else avx512 (sgemm.h) when this build and
/// CPU have it, else avx2+eigen when the CPU has AVX2 + FMA, else eigen. avx2 runs sgemm_avx2.h on
/// every shape; avx2+eigen only where avx2_kernel_preferred() says it beats AVX2 Eigen, Eigen on
/// the rest. Errors: dtr::Error naming DTR_SGEMM when the chosen one is missing.
enum class SgemmKernel { avx512, avx2, eigen, avx2_eigen };
SgemmKernel sgemm_kernel();
const char* sgemm_kernel_name(SgemmKernel k);

/// Under SgemmKernel::avx2_eigen: true when an m x n x k f32 product goes to dtr's AVX2 kernel
/// (k <= 64 or m <= 8, the shapes where it measured faster than Eigen compiled for AVX2 in
/// dtr-bench gemm), false when it goes to Eigen. Depends on the shape only, so results stay
/// independent of the thread count.
bool avx2_kernel_preferred(int64_t m, int64_t n, int64_t k);

/// One GEMM. lda_row/lda_col: element strides of A's rows / columns (one of them must be 1 or
/// belong to a size-1 dim, otherwise the caller copies). C is row-major contiguous with row
/// stride n. When `accumulate` C += A*B, else C = A*B. Parallel inside (OpenMP) unless called
/// from an OpenMP parallel region. The f32 kernels' results do not depend on the thread count.
/// The f32 kernel is sgemm_kernel(). Errors: dtr::Error when DTR_SGEMM names a kernel this build
/// or CPU lacks.
template <class T>
void gemm(int64_t m, int64_t n, int64_t k, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
          int64_t b_cs, T* C, bool accumulate);

}  // namespace dtr::cpu
