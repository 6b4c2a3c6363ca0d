#include "bench/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/gemm_eigen_avx2.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops/cpu/gemm.h"
#include "tensor/ops/cpu/sgemm.h"
#include "tensor/ops/cpu/sgemm_avx2.h"
#include "tensor/ops.h"
#include "tensor/random.h"

extern "C" void openblas_set_num_threads(int);

namespace dtr::bench {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ColMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using StrideMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;

struct Shape3 {
  const char* name;
  int64_t batch, m, k, n;
  bool transpose_b;  // B given as [n, k] and used transposed (the linear layer layout)
  bool transpose_a = false;  // A given as [k, m] and used transposed (weight-gradient layout)
};

/// C = op(A) * op(B) with raw Eigen on row-major storage of A ([m,k] or [k,m]) and B ([k,n] or [n,k]).
void eigen_gemm(const Shape3& s, const float* pa, const float* pb, float* pc) {
  Eigen::Map<RowMat> c(pc, s.m, s.n);
  auto run = [&](const auto& a) {
    if (s.transpose_b) c.noalias() = a * Eigen::Map<const RowMat>(pb, s.n, s.k).transpose();
    else c.noalias() = a * Eigen::Map<const RowMat>(pb, s.k, s.n);
  };
  if (s.transpose_a) run(Eigen::Map<const RowMat>(pa, s.k, s.m).transpose());
  else run(Eigen::Map<const RowMat>(pa, s.m, s.k));
}

/// Best (minimum) seconds per call over 7 timed calls after 2 warm-ups: the machine is shared,
/// so the fastest run is the closest to the kernel's own speed.
double best_seconds(const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

}  // namespace

int bench_gemm(int argc, char** argv) {
  // Arguments: `--blas` adds OpenBLAS (off by default: its idle threads spin and slow the other
  // columns on a 2-core machine); `--sgemm-only` times the sgemm column alone (short runs for
  // interleaved A/Bs of the kernel); any other argument is a substring, only shapes whose name
  // contains it run.
  std::string filter;
  bool with_blas = false, sgemm_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--blas") with_blas = true;
    else if (std::string(argv[i]) == "--sgemm-only") sgemm_only = true;
    else filter = argv[i];
  }
  NoGradGuard ng;
  const int threads = omp_get_max_threads();
  openblas_set_num_threads(with_blas ? threads : 1);
  Eigen::setNbThreads(threads);
  // T = 1024 tokens of the Llama + LoRA train-step (hidden 576, intermediate 1536, kv 192,
  // vocab 49152, LoRA rank 8): every GEMM shape of one step, plus a few squares.
  const std::vector<Shape3> shapes = {
      {"square 512", 1, 512, 512, 512, false},
      {"square 1024", 1, 1024, 1024, 1024, false},
      {"lm_head fwd 1024x576 @ [49152x576]^T", 1, 1024, 576, 49152, true},
      {"lm_head bwd 1024x49152 @ 49152x576", 1, 1024, 49152, 576, false},
      {"layer fwd 1024x576 @ [576x576]^T", 1, 1024, 576, 576, true},
      {"layer fwd 1024x576 @ [192x576]^T", 1, 1024, 576, 192, true},
      {"layer fwd 1024x576 @ [1536x576]^T", 1, 1024, 576, 1536, true},
      {"layer fwd 1024x1536 @ [576x1536]^T", 1, 1024, 1536, 576, true},
      {"layer bwd 1024x576 @ 576x576", 1, 1024, 576, 576, false},
      {"layer bwd 1024x192 @ 192x576", 1, 1024, 192, 576, false},
      {"layer bwd 1024x1536 @ 1536x576", 1, 1024, 1536, 576, false},
      {"layer bwd 1024x576 @ 576x1536", 1, 1024, 576, 1536, false},
      {"lora 1024x576 @ [8x576]^T", 1, 1024, 576, 8, true},
      {"lora 1024x1536 @ [8x1536]^T", 1, 1024, 1536, 8, true},
      {"lora 1024x8 @ 8x1536", 1, 1024, 8, 1536, false},
      {"lora 1024x8 @ [1536x8]^T", 1, 1024, 8, 1536, true},
      {"lora 1024x8 @ [576x8]^T", 1, 1024, 8, 576, true},
      {"lora dA [1024x8]^T @ 1024x576", 1, 8, 1024, 576, false, true},
      {"lora dA [1024x8]^T @ 1024x1536", 1, 8, 1024, 1536, false, true},
      {"lora dB [1024x576]^T @ 1024x8", 1, 576, 1024, 8, false, true},
      {"lora dB [1024x1536]^T @ 1024x8", 1, 1536, 1024, 8, false, true},
      {"attn bmm 9x256x64 @ 9x64x256", 9, 256, 64, 256, false},
      // Full fine-tune weight gradients (dW = dY^T X, K = tokens; mm_mat2_backward's layout).
      {"full dW [1024x576]^T @ 1024x576", 1, 576, 1024, 576, false, true},
      {"full dW [1024x192]^T @ 1024x576", 1, 192, 1024, 576, false, true},
      {"full dW [1024x1536]^T @ 1024x576", 1, 1536, 1024, 576, false, true},
      {"full dW [1024x576]^T @ 1024x1536", 1, 576, 1024, 1536, false, true},
      {"lm_head dW [1024x49152]^T @ 1024x576", 1, 49152, 1024, 576, false, true},
  };
  const bool avx2 = cpu::sgemm_avx2_available(), avx512 = cpu::sgemm_available();
  std::printf("dtr-bench gemm: f32, %d threads (OMP_NUM_THREADS), best of 7; dtr = dtr::mm/bmm (output\n"
              "allocation included), sgemm = dtr::cpu::gemm into a preallocated C (the kernel alone: %s),\n"
              "Eigen = raw Eigen compiled like the kernels (%s); avx2 = dtr's AVX2 kernel (sgemm_avx2.h),\n"
              "Eig-avx2 = raw Eigen compiled for AVX2 + FMA, dtr-avx2 = what dtr runs on a CPU without AVX-512\n"
              "(gemm.cpp's avx2+eigen: the AVX2 kernel where avx2_kernel_preferred(), marked k, else Eigen,\n"
              "marked e, whose time is Eig-avx2's: the same code); 0 = not available\n",
              threads, cpu::sgemm_kernel_name(cpu::sgemm_kernel()), avx512 ? "AVX-512" : "the build's -march");
  std::printf("%-40s %9s %9s %9s %9s %9s %9s %10s %9s %8s %9s %9s\n", "shape", "dtr GF/s", "sgemm", "Eigen", "BLAS",
              "avx2", "Eig-avx2", "dtr-avx2", "dtr ms", "dtr/Eig", "sgemm/Eig", "dA2/Eig2");
  manual_seed(1);
  for (const auto& s : shapes) {
    if (!filter.empty() && std::string(s.name).find(filter) == std::string::npos) continue;
    const double flops = 2.0 * s.batch * s.m * s.n * s.k;
    Tensor A = s.transpose_a ? randn({s.batch, s.k, s.m}) : randn({s.batch, s.m, s.k});
    Tensor B = s.transpose_b ? randn({s.batch, s.n, s.k}) : randn({s.batch, s.k, s.n});
    Tensor Av = s.transpose_a ? A.transpose(1, 2) : A;
    Tensor Bv = s.transpose_b ? B.transpose(1, 2) : B;
    const int64_t a_rs = s.transpose_a ? 1 : s.k, a_cs = s.transpose_a ? s.m : 1;
    const int64_t b_rs = s.transpose_b ? 1 : s.n, b_cs = s.transpose_b ? s.k : 1;
    double t_dtr = 0.0;
    if (!sgemm_only && s.batch == 1) {
      Tensor a2 = s.transpose_a ? A.view({s.k, s.m}).t() : A.view({s.m, s.k});
      Tensor b2 = s.transpose_b ? B.view({s.n, s.k}).t() : B.view({s.k, s.n});
      t_dtr = best_seconds([&] { Tensor c = mm(a2, b2); });
    } else if (!sgemm_only) {
      t_dtr = best_seconds([&] { Tensor c = bmm(Av, Bv); });
    }
    std::vector<float> C(static_cast<size_t>(s.batch * s.m * s.n));
    const float* pa = A.data<float>();
    const float* pb = B.data<float>();
    const double t_kernel = best_seconds([&] {
      for (int64_t i = 0; i < s.batch; ++i)
        cpu::gemm<float>(s.m, s.n, s.k, pa + i * s.m * s.k, a_rs, a_cs, pb + i * s.k * s.n, b_rs, b_cs,
                         C.data() + i * s.m * s.n, false);
    });
    // Raw Eigen on the same memory, preallocated output.
    const double t_eigen = sgemm_only ? 0.0 : best_seconds([&] {
      for (int64_t i = 0; i < s.batch; ++i)
        eigen_gemm(s, pa + i * s.m * s.k, pb + i * s.k * s.n, C.data() + i * s.m * s.n);
    });
    const double t_blas = !with_blas || sgemm_only ? 0.0 : best_seconds([&] {
      for (int64_t i = 0; i < s.batch; ++i)
        cblas_sgemm(CblasRowMajor, s.transpose_a ? CblasTrans : CblasNoTrans, s.transpose_b ? CblasTrans : CblasNoTrans,
                    s.m, s.n, s.k, 1.0f, pa + i * s.m * s.k, s.transpose_a ? s.m : s.k, pb + i * s.k * s.n,
                    s.transpose_b ? s.k : s.n, 0.0f, C.data() + i * s.m * s.n, s.n);
    });
    // dtr's AVX2 kernel and raw AVX2 Eigen (with AVX-512 hardware too: what an AVX2-only CPU runs).
    const int64_t c_step = s.m * s.n;
    const double t_avx2 = !avx2 || sgemm_only ? 0.0 : best_seconds([&] {
      for (int64_t i = 0; i < s.batch; ++i)
        cpu::sgemm_avx2(s.m, s.n, s.k, pa + i * s.m * s.k, a_rs, a_cs, pb + i * s.k * s.n, b_rs, b_cs,
                        C.data() + i * c_step, s.n, false);
    });
    const double t_eigen2 = !avx2 || sgemm_only ? 0.0 : best_seconds([&] {
      for (int64_t i = 0; i < s.batch; ++i)
        eigen_gemm_avx2(s.m, s.n, s.k, pa + i * s.m * s.k, s.transpose_a, pb + i * s.k * s.n, s.transpose_b,
                        C.data() + i * c_step);
    });
    const bool kern2 = cpu::avx2_kernel_preferred(s.m, s.n, s.k);
    const double t_dtr2 = kern2 ? t_avx2 : t_eigen2;
    auto gf = [&](double t) { return t > 0 ? flops / t * 1e-9 : 0.0; };
    std::printf("%-40s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %8.1f %c %9.3f %8.2f %9.2f %9.2f\n", s.name, gf(t_dtr),
                gf(t_kernel), gf(t_eigen), with_blas ? gf(t_blas) : 0.0, gf(t_avx2), gf(t_eigen2), gf(t_dtr2),
                kern2 ? 'k' : 'e', t_dtr * 1e3, t_dtr > 0 ? t_eigen / t_dtr : 0.0, t_eigen / t_kernel,
                t_dtr2 > 0 ? t_eigen2 / t_dtr2 : 0.0);
  }
  return 0;
}

}  // namespace dtr::bench
