#pragma once
#include <cstdint>
namespace dtr::bench {
/// C[m,n] = op(A) * op(B) with raw Eigen compiled for AVX2 + FMA (-march=x86-64-v3, Eigen's
/// namespace renamed in that file so that its templates do not merge with the AVX-512 Eigen of
/// gemm.cpp): the reference of dtr's AVX2 kernel in `dtr-bench gemm`. A is row-major [m,k]
/// (transpose_a: [k,m]), B row-major [k,n] (transpose_b: [n,k]), C row-major [m,n].
void eigen_gemm_avx2(int64_t m, int64_t n, int64_t k, const float* A, bool transpose_a, const float* B,
                     bool transpose_b, float* C);
}  // namespace dtr::bench
