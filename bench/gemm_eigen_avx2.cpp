// Raw Eigen for AVX2 (see gemm_eigen_avx2.h). Eigen's namespace is renamed here: the same
// templates compiled for AVX-512 in gemm.cpp would otherwise be merged by the linker (one
// definition kept for both), and this column would not measure AVX2 code.
#define Eigen EigenAvx2
#include <Eigen/Core>
#undef Eigen

#include "bench/gemm_eigen_avx2.h"

namespace dtr::bench {

void eigen_gemm_avx2(int64_t m, int64_t n, int64_t k, const float* A, bool transpose_a, const float* B,
                     bool transpose_b, float* C) {
  using RowMat = EigenAvx2::Matrix<float, EigenAvx2::Dynamic, EigenAvx2::Dynamic, EigenAvx2::RowMajor>;
  EigenAvx2::Map<RowMat> c(C, m, n);
  auto run = [&](const auto& a) {
    if (transpose_b) c.noalias() = a * EigenAvx2::Map<const RowMat>(B, n, k).transpose();
    else c.noalias() = a * EigenAvx2::Map<const RowMat>(B, k, n);
  };
  if (transpose_a) run(EigenAvx2::Map<const RowMat>(A, k, m).transpose());
  else run(EigenAvx2::Map<const RowMat>(A, m, k));
}

}  // namespace dtr::bench
