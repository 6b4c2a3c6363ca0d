#include "bench/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <Eigen/Core>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/random.h"

extern "C" void openblas_set_num_threads(int);

namespace dtr::bench {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Shape3 {
  const char* name;
  int64_t batch, m, k, n;
  bool transpose_b;  // B given as [n, k] and used transposed (the linear layer layout)
};

}  // namespace

int bench_gemm(int argc, char** argv) {
  (void)argc;
  (void)argv;
  NoGradGuard ng;
  const int threads = omp_get_max_threads();
  openblas_set_num_threads(threads);
  Eigen::setNbThreads(threads);
  const std::vector<Shape3> shapes = {
      {"square 512", 1, 512, 512, 512, false},
      {"square 1024", 1, 1024, 1024, 1024, false},
      {"linear fwd 1024x576 @ [1536x576]^T", 1, 1024, 576, 1536, true},
      {"linear fwd 1024x1536 @ [576x1536]^T", 1, 1024, 1536, 576, true},
      {"qkv 2048x576 @ [576x576]^T", 1, 2048, 576, 576, true},
      {"attn bmm 9x256x64 @ 9x64x256", 9, 256, 64, 256, false},
  };
  std::printf("dtr-bench gemm: f32, %d threads (OMP_NUM_THREADS), median of 7\n", threads);
  std::printf("%-38s %10s %10s %10s %9s %9s\n", "shape", "dtr GF/s", "Eigen GF/s", "BLAS GF/s", "dtr/Eigen",
              "dtr/BLAS");
  manual_seed(1);
  for (const auto& s : shapes) {
    const double flops = 2.0 * s.batch * s.m * s.n * s.k;
    Tensor A = randn({s.batch, s.m, s.k});
    Tensor B = s.transpose_b ? randn({s.batch, s.n, s.k}) : randn({s.batch, s.k, s.n});
    Tensor Bv = s.transpose_b ? B.transpose(1, 2) : B;
    double t_dtr;
    if (s.batch == 1) {
      Tensor a2 = A.view({s.m, s.k});
      Tensor b2 = s.transpose_b ? B.view({s.n, s.k}).t() : B.view({s.k, s.n});
      t_dtr = median_seconds([&] { Tensor c = mm(a2, b2); });
    } else {
      t_dtr = median_seconds([&] { Tensor c = bmm(A, Bv); });
    }
    // Raw Eigen on the same memory, preallocated output.
    std::vector<float> C(static_cast<size_t>(s.batch * s.m * s.n));
    const float* pa = A.data<float>();
    const float* pb = B.data<float>();
    const double t_eigen = median_seconds([&] {
      for (int64_t i = 0; i < s.batch; ++i) {
        Eigen::Map<const RowMat> a(pa + i * s.m * s.k, s.m, s.k);
        Eigen::Map<RowMat> c(C.data() + i * s.m * s.n, s.m, s.n);
        if (s.transpose_b) c.noalias() = a * Eigen::Map<const RowMat>(pb + i * s.n * s.k, s.n, s.k).transpose();
        else c.noalias() = a * Eigen::Map<const RowMat>(pb + i * s.k * s.n, s.k, s.n);
      }
    });
    const double t_blas = median_seconds([&] {
      for (int64_t i = 0; i < s.batch; ++i)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, s.transpose_b ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.0f,
                    pa + i * s.m * s.k, s.k, pb + i * s.k * s.n, s.transpose_b ? s.k : s.n, 0.0f,
                    C.data() + i * s.m * s.n, s.n);
    });
    std::printf("%-38s %10.1f %10.1f %10.1f %9.2f %9.2f\n", s.name, flops / t_dtr * 1e-9, flops / t_eigen * 1e-9,
                flops / t_blas * 1e-9, t_eigen / t_dtr, t_blas / t_dtr);
  }
  return 0;
}

}  // namespace dtr::bench
