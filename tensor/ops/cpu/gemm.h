#pragma once
// CPU GEMM over strided memory (f32: dtr's AVX-512 sgemm.h when built for AVX-512, else Eigen, or
// the AVX2 twin sgemm_avx2.h with DTR_SGEMM=avx2; f64: Eigen): C[m,n] (+)= A[m,k] * B[k,n] where A and B may be transposed views (either stride
// may be 1); no copy is made for transposes.
#include <cstdint>

namespace dtr::cpu {

/// The f32 GEMM kernel gemm<float> uses: DTR_SGEMM=avx512|avx2|eigen in the environment (read
/// once; DTR_EIGEN_SGEMM=1 = eigen), else avx512 (sgemm.h) when this build and CPU have it, else
/// eigen; avx2 (sgemm_avx2.h, every shape) only when chosen: it did not beat AVX2 Eigen (README
/// "Results"). Errors: dtr::Error naming DTR_SGEMM when the chosen one is
/// missing.
enum class SgemmKernel { avx512, avx2, eigen };
SgemmKernel sgemm_kernel();
const char* sgemm_kernel_name(SgemmKernel k);

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
