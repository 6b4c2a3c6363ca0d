#pragma once
namespace dtr::bench {
/// `dtr-bench gemm-gpu [--dtype bf16|f16|f32] [--iters N]` (CUDA builds): TFLOP/s of dtr::mm /
/// dtr::bmm on CUDA tensors (dispatch + caching-allocator output + cuBLASLt) for the GEMMs of a
/// ~1B-parameter Llama training step (hidden 2048, intermediate 5632, 32 heads of 128, GQA 8 kv
/// heads, 4096 tokens; forward, input-gradient and weight-gradient layouts, attention bmm),
/// beside raw cublasGemmEx / cublasGemmStridedBatchedEx on the same operands (preallocated
/// output, CUBLAS_COMPUTE_32F, default tensor-op algorithm), and the cublasGemmEx peak of the
/// run (8192^3). Timed with CUDA events on dtr's compute stream, median of 5 runs of N calls.
/// Without a CUDA device: an error message and exit code 1.
int bench_gemm_gpu(int argc, char** argv);
}  // namespace dtr::bench
