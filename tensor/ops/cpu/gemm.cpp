#include "tensor/ops/cpu/gemm.h"

#include <Eigen/Core>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "tensor/ops/cpu/sgemm.h"
#include "tensor/ops/cpu/sgemm_avx2.h"
#include "tensor/env_vars.h"
#include "tensor/error.h"

namespace dtr::cpu {
namespace {

template <class T>
using RowMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
template <class T>
using ColMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>, 0, Eigen::OuterStride<>>;
template <class T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

template <class T, class MA, class MB>
void run(const MA& a, const MB& b, T* C, int64_t m, int64_t n, bool acc) {
  OutMap<T> c(C, m, n);
  if (acc) c.noalias() += a * b;
  else c.noalias() = a * b;
}

template <class T, class MA>
void with_b(const MA& a, int64_t n, int64_t k, const T* B, int64_t b_rs, int64_t b_cs, T* C, int64_t m, bool acc) {
  if (b_cs == 1 || n == 1) run<T>(a, RowMap<T>(B, k, n, Eigen::OuterStride<>(b_rs)), C, m, n, acc);
  else run<T>(a, ColMap<T>(B, k, n, Eigen::OuterStride<>(b_cs)), C, m, n, acc);
}

}  // namespace

SgemmKernel sgemm_kernel() {
  static const SgemmKernel k = [] {
    // DTR_SGEMM chooses; DTR_EIGEN_SGEMM=1 is the older spelling of DTR_SGEMM=eigen.
    const std::string want = env::flag("DTR_EIGEN_SGEMM") ? std::string("eigen") : env::choice("DTR_SGEMM");
    if (want == "avx512") {
      DTR_CHECK(sgemm_available(), "DTR_SGEMM=avx512: this build has no AVX-512 SGEMM (compile tensor/ops/cpu with "
                                   "-march=x86-64-v4 on an AVX-512 machine)");
      return SgemmKernel::avx512;
    }
    if (want == "avx2") {
      DTR_CHECK(sgemm_avx2_available(), "DTR_SGEMM=avx2: this build or CPU has no AVX2 + FMA");
      return SgemmKernel::avx2;
    }
    if (want == "eigen") return SgemmKernel::eigen;
    if (want == "avx2+eigen") {
      DTR_CHECK(sgemm_avx2_available(), "DTR_SGEMM=avx2+eigen: this build or CPU has no AVX2 + FMA");
      return SgemmKernel::avx2_eigen;
    }
    // Without AVX-512: per shape, dtr's AVX2 kernel where it beats AVX2 Eigen (avx2_kernel_preferred),
    // Eigen elsewhere; Eigen alone without AVX2.
    if (sgemm_available()) return SgemmKernel::avx512;
    return sgemm_avx2_available() ? SgemmKernel::avx2_eigen : SgemmKernel::eigen;
  }();
  return k;
}

const char* sgemm_kernel_name(SgemmKernel k) {
  switch (k) {
    case SgemmKernel::avx512: return "avx512";
    case SgemmKernel::avx2: return "avx2";
    case SgemmKernel::eigen: return "eigen";
    case SgemmKernel::avx2_eigen: return "avx2+eigen";
  }
  return "?";
}

bool avx2_kernel_preferred(int64_t m, int64_t n, int64_t k) {
  (void)n;
  // dtr-bench gemm, quiet run of 2026-12-01 (2 threads, AVX2 kernel / AVX2 Eigen): k <= 64 (LoRA's
  // rank-8 up-projections 1.36-2.10x, attention's 64-deep bmm 1.14x) and m <= 8 (LoRA dA 1.55-1.94x)
  // win; the packed layer / square shapes (0.86-0.99x) and the n = 8 skinny ones (0.49-0.69x) lose.
  return k <= 64 || m <= 8;
}

template <class T>
void gemm(int64_t m, int64_t n, int64_t k, const T* A, int64_t a_rs, int64_t a_cs, const T* B, int64_t b_rs,
          int64_t b_cs, T* C, bool accumulate) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {  // dtr's own SGEMM (sgemm.h, sgemm_avx2.h) unless Eigen is chosen
    switch (sgemm_kernel()) {
      case SgemmKernel::avx512: sgemm(m, n, k, A, a_rs, a_cs, B, b_rs, b_cs, C, n, accumulate); return;
      case SgemmKernel::avx2: sgemm_avx2(m, n, k, A, a_rs, a_cs, B, b_rs, b_cs, C, n, accumulate); return;
      case SgemmKernel::avx2_eigen:
        if (avx2_kernel_preferred(m, n, k)) {
          sgemm_avx2(m, n, k, A, a_rs, a_cs, B, b_rs, b_cs, C, n, accumulate);
          return;
        }
        break;
      case SgemmKernel::eigen: break;
    }
  }
  if (k == 0) {
    if (!accumulate) OutMap<T>(C, m, n).setZero();
    return;
  }
  // The caller guarantees each operand is row-major (unit column stride) or column-major
  // (unit row stride); the stride of a size-1 dim does not matter.
  if (a_cs == 1 || k == 1) with_b<T>(RowMap<T>(A, m, k, Eigen::OuterStride<>(a_rs)), n, k, B, b_rs, b_cs, C, m, accumulate);
  else with_b<T>(ColMap<T>(A, m, k, Eigen::OuterStride<>(a_cs)), n, k, B, b_rs, b_cs, C, m, accumulate);
}

template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t,
                          float*, bool);
template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t, int64_t,
                           double*, bool);

}  // namespace dtr::cpu
