#pragma once
// GEMM on CUDA through cuBLASLt: the kernels of mm and bmm for CUDA tensors, and a bias
// epilogue for callers that fuse a linear layer's bias.
//   dtypes: bf16 / f16 inputs and output with f32 accumulation (CUBLAS_COMPUTE_32F); f32 with
//           CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 when TF32 is allowed
//           (env DTR_ALLOW_TF32=1, read at first use, or set_allow_tf32; off by default like
//           PyTorch's torch.backends.cuda.matmul.allow_tf32); f64 with CUBLAS_COMPUTE_64F.
//   layouts: operands whose last two dims have one unit stride (row-major or transposed views)
//           are passed to cuBLASLt as they are (no copy); others are made contiguous first.
//   workspace: 32 MiB per (device, stream), allocated once; algorithms from cuBLASLt's
//           heuristic are cached per shape / layout / alignment.
// Source: cuBLASLt API reference (cublasLtMatmul, row-major C = A B computed as column-major
// C^T = B^T A^T).
#ifdef DTR_WITH_CUDA
#include <cublasLt.h>

#include "tensor/tensor.h"

/// Throws dtr::Error naming the failed cuBLAS(Lt) call, file, line and the status string.
#define DTR_CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                             \
    cublasStatus_t dtr_cublas_st_ = (expr);                                                        \
    if (dtr_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                   \
      throw ::dtr::Error(::dtr::detail::cat(#expr, " failed at ", __FILE__, ":", __LINE__, ": ",  \
                                            cublasLtGetStatusString(dtr_cublas_st_)));             \
  } while (0)

namespace dtr::cuda {

/// Whether f32 GEMMs may use TF32 tensor cores (default: env DTR_ALLOW_TF32 == "1").
bool allow_tf32();
void set_allow_tf32(bool on);

/// out = a @ b (+ bias) on the current stream of the operands' CUDA device.
/// Shapes: a [m, k], b [k, n] -> [m, n]; or a [B, m, k], b [B, k, n] -> [B, m, n]; bias [n]
/// (added to every row, through the cuBLASLt bias epilogue) or undefined.
/// Errors: operands not on one CUDA device, different dtypes, integer dtypes, shape mismatch.
Tensor gemm(const Tensor& a, const Tensor& b, const Tensor& bias = Tensor());

/// The cuBLASLt handle of the current device (created on first use).
cublasLtHandle_t lt_handle();

}  // namespace dtr::cuda
#endif  // DTR_WITH_CUDA
