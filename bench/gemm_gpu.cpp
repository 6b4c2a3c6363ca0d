#include "bench/gemm_gpu.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/autograd/grad_mode.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda/gemm.h"
#include "tensor/random.h"

#define BENCH_CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                                    \
    cublasStatus_t st_ = (expr);                                                                          \
    DTR_CHECK(st_ == CUBLAS_STATUS_SUCCESS, #expr, " failed: ", cublasGetStatusString(st_), " at ", __FILE__, \
              ":", __LINE__);                                                                             \
  } while (0)

namespace dtr::bench {
namespace {

/// out [batch, m, n] = op(a) op(b); ta: a stored [k, m] and used transposed (weight-gradient
/// layout); tb: b stored [n, k] and used transposed (the linear layer's weight).
struct GemmShape {
  const char* name;
  int64_t batch, m, k, n;
  bool ta, tb;
};

/// Median over 5 runs of the seconds per call of `fn` (iters calls per run), timed with CUDA
/// events on `stream`.
template <class F>
double time_gpu(cudaStream_t stream, int iters, F&& fn) {
  for (int i = 0; i < 3; ++i) fn();  // warm-up (heuristics, allocator cache)
  cudaEvent_t e0, e1;
  DTR_CUDA_CHECK(cudaEventCreate(&e0));
  DTR_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    DTR_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int i = 0; i < iters; ++i) fn();
    DTR_CUDA_CHECK(cudaEventRecord(e1, stream));
    DTR_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DTR_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1e-3 / iters);
  }
  DTR_CUDA_CHECK(cudaEventDestroy(e0));
  DTR_CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::f32: return CUDA_R_32F;
    default: DTR_ERROR("gemm-gpu: --dtype must be bf16, f16 or f32, got ", dt);
  }
}

/// Raw cuBLAS on the same row-major operands (column-major C^T = op(B)^T op(A)^T).
void raw_gemm(cublasHandle_t h, const GemmShape& s, DType dt, const void* a, const void* b, void* c) {
  const cublasComputeType_t ct =
      dt == DType::f32 && cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t t = cuda_type(dt);
  // cuBLAS "A" = b^T: b stored [k, n] row-major is col-major [n x k] ld n (op N); b stored
  // [n, k] (tb) is col-major [k x n] ld k (op T).
  const cublasOperation_t opa = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = static_cast<int>(s.tb ? s.k : s.n);
  // cuBLAS "B" = a^T: a stored [m, k] is col-major [k x m] ld k (op N); a stored [k, m] (ta) is
  // col-major [m x k] ld m (op T).
  const cublasOperation_t opb = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = static_cast<int>(s.ta ? s.m : s.k);
  const int n = static_cast<int>(s.n), m = static_cast<int>(s.m), k = static_cast<int>(s.k);
  if (s.batch == 1) {
    BENCH_CUBLAS_CHECK(cublasGemmEx(h, opa, opb, n, m, k, &one, b, t, lda, a, t, ldb, &zero, c, t, n,
                                    ct, CUBLAS_GEMM_DEFAULT_TENSOR_OP));
  } else {
    BENCH_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, opa, opb, n, m, k, &one, b, t, lda, s.k * s.n, a, t, ldb,
                                                  s.m * s.k, &zero, c, t, n, s.m * s.n, static_cast<int>(s.batch),
                                                  ct, CUBLAS_GEMM_DEFAULT_TENSOR_OP));
  }
}

}  // namespace

int bench_gemm_gpu(int argc, char** argv) {
  DType dt = DType::bf16;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dtype" && i + 1 < argc) {
      dt = dtype_from_name(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::stoi(argv[++i]));
    } else {
      DTR_ERROR("gemm-gpu: unknown argument '", a, "' (options: --dtype bf16|f16|f32, --iters N)");
    }
  }
  (void)cuda_type(dt);
  if (!cuda::is_available()) {
    std::fprintf(stderr, "dtr-bench gemm-gpu: no CUDA device (needs a GPU)\n");
    return 1;
  }
  NoGradGuard ng;
  const Device dev = Device::cuda(cuda::current_device());
  cudaStream_t stream = cuda::current_stream();
  cublasHandle_t h;
  BENCH_CUBLAS_CHECK(cublasCreate(&h));
  BENCH_CUBLAS_CHECK(cublasSetStream(h, stream));
  if (dt == DType::f32) BENCH_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));

  cudaDeviceProp prop{};
  DTR_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev.index));
  const int64_t T = 4096, H = 2048, I = 5632, KV = 512, V = 32000;
  const std::vector<GemmShape> shapes = {
      {"peak: square 8192", 1, 8192, 8192, 8192, false, false},
      {"q/o proj fwd 4096x2048 @ [2048x2048]^T", 1, T, H, H, false, true},
      {"k/v proj fwd 4096x2048 @ [512x2048]^T", 1, T, H, KV, false, true},
      {"gate/up fwd 4096x2048 @ [5632x2048]^T", 1, T, H, I, false, true},
      {"down fwd 4096x5632 @ [2048x5632]^T", 1, T, I, H, false, true},
      {"down dgrad 4096x2048 @ [2048x5632]", 1, T, H, I, false, false},
      {"gate/up wgrad [4096x5632]^T @ 4096x2048", 1, I, T, H, true, false},
      {"lm_head fwd 4096x2048 @ [32000x2048]^T", 1, T, H, V, false, true},
      {"attn scores bmm 64x1024x128 @ 64x128x1024", 64, 1024, 128, 1024, false, false},
      {"attn values bmm 64x1024x1024 @ 64x1024x128", 64, 1024, 1024, 128, false, false},
  };
  std::printf("dtr-bench gemm-gpu: %s on %s, %s, median of 5 x %d calls (TF32 %s)\n", dtype_name(dt), prop.name,
              dev.str().c_str(), iters, cuda::allow_tf32() ? "on" : "off");
  std::printf("%-46s %11s %12s %9s %9s\n", "shape", "dtr TF/s", "cuBLAS TF/s", "dtr/cuBLAS", "dtr/peak");
  manual_seed(1);
  double peak = 0;
  for (const GemmShape& s : shapes) {
    const double flops = 2.0 * s.batch * s.m * s.n * s.k;
    const TensorOptions opt = TensorOptions(dt).with_device(dev);
    const Tensor A = randn(s.ta ? Shape{s.batch, s.k, s.m} : Shape{s.batch, s.m, s.k}, opt);
    const Tensor B = randn(s.tb ? Shape{s.batch, s.n, s.k} : Shape{s.batch, s.k, s.n}, opt);
    const Tensor Av = s.ta ? A.transpose(1, 2) : A;
    const Tensor Bv = s.tb ? B.transpose(1, 2) : B;
    double t_dtr;
    if (s.batch == 1) {
      const Tensor a2 = Av.squeeze(0), b2 = Bv.squeeze(0);
      t_dtr = time_gpu(stream, iters, [&] { Tensor c = mm(a2, b2); });
    } else {
      t_dtr = time_gpu(stream, iters, [&] { Tensor c = bmm(Av, Bv); });
    }
    Tensor C = empty({s.batch, s.m, s.n}, opt);
    const double t_raw =
        time_gpu(stream, iters, [&] { raw_gemm(h, s, dt, A.data_ptr(), B.data_ptr(), C.data_ptr()); });
    const double tf_dtr = flops / t_dtr * 1e-12, tf_raw = flops / t_raw * 1e-12;
    if (peak == 0) peak = tf_raw;  // the first shape is the peak reference
    std::printf("%-46s %11.1f %12.1f %9.2f %9.2f\n", s.name, tf_dtr, tf_raw, tf_dtr / tf_raw, tf_dtr / peak);
  }
  std::printf("cuBLAS peak (cublasGemmEx %s 8192^3) in this run: %.1f TFLOP/s\n", dtype_name(dt), peak);
  BENCH_CUBLAS_CHECK(cublasDestroy(h));
  return 0;
}

}  // namespace dtr::bench
