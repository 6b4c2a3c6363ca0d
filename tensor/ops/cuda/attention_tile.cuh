#pragma once
// Device helpers shared by the attention kernels (attention_forward.cu, attention_backward.cu):
// element conversion, strided tile loads into shared memory, the block geometry.
// See attention.cuh for the algorithm.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <cstdint>

#include "tensor/ops/cuda/attention.cuh"

namespace dtr::cuda::attn {

// Block geometry: 256 threads; tiles of 64 query rows x 64 keys. In the score phase thread t
// owns row t / 4 of the tile and the 16 columns (t % 4) + 4 j, j < 16; the four threads of a row
// are consecutive lanes of one warp, so row reductions are two xor-shuffles. In the accumulate
// phase thread t owns row t / 4 of its output tile and the HD / 4 columns (t % 4) + 4 i.
constexpr int kThreads = 256;
constexpr int kBlockQ = 64;
constexpr int kBlockK = 64;
constexpr int kColsPerThread = kBlockK / 4;  // score columns per thread
static_assert(kThreads == 4 * kBlockQ && kThreads == 4 * kBlockK, "4 threads per tile row");

/// Row stride (floats) of a [rows][HD] tile in shared memory: HD + 1, odd, so that the rows
/// read by one warp fall in different banks.
template <int HD>
constexpr int tile_ld() {
  return HD + 1;
}
/// Row stride of a [kBlockQ][kBlockK] score tile.
constexpr int kScoreLd = kBlockK + 1;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

/// Pointer to element [b, h, row, 0] of a 4-d tensor with element strides `st`.
template <class T>
__device__ __forceinline__ const T* head_row(const void* base, const int64_t (&st)[4], int b, int h, int64_t row) {
  return static_cast<const T*>(base) + b * st[0] + h * st[1] + row * st[2];
}

/// Loads `nvalid` rows (row stride `sl`, element stride `sd`, `dim` elements each) starting at
/// `src` into the shared tile `dst` [ROWS][HD + 1] as f32; rows >= nvalid and columns >= dim are
/// zero. All threads of the block take part; the caller synchronises afterwards.
template <class T, int HD, int ROWS>
__device__ __forceinline__ void load_tile(float* dst, const T* src, int64_t sl, int64_t sd, int nvalid, int dim) {
  constexpr int LD = tile_ld<HD>();
  for (int idx = threadIdx.x; idx < ROWS * HD; idx += kThreads) {
    const int r = idx / HD, d = idx % HD;
    float x = 0.0f;
    if (r < nvalid && d < dim) x = to_f32(src[r * sl + d * sd]);
    dst[r * LD + d] = x;
  }
}

/// Max / sum over the four consecutive lanes that own one tile row (all 32 lanes must call).
__device__ __forceinline__ float row_max4(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float row_sum4(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// First key index not visible to any of the query rows [0, i_end) of `p` (ForwardParams or
/// BackwardParams): all S keys, or clamp(i_end + diag, 0, S) when causal (key j visible from
/// query i iff j <= i + diag).
template <class P>
__device__ __forceinline__ int key_end(const P& p, int i_end) {
  if (!p.causal) return p.S;
  const int e = i_end + p.diag;
  return e < 0 ? 0 : (e > p.S ? p.S : e);
}

/// True when key j is visible from query i of batch row b (both in range): j <= i + diag when
/// causal, j > i + diag - window with a sliding window (window > 0), and the same document id
/// when the call has document ids.
template <class P>
__device__ __forceinline__ bool visible(const P& p, int b, int i, int j) {
  return i < p.T && j < p.S && (!p.causal || j <= i + p.diag) && (p.window <= 0 || j > i + p.diag - p.window) &&
         (p.q_doc == nullptr || p.q_doc[static_cast<int64_t>(b) * p.T + i] == p.k_doc[static_cast<int64_t>(b) * p.S + j]);
}

/// Tensor-core forward (attention_forward_mma.cu), instantiated for T in {__nv_bfloat16,
/// __half} and HD in {64, 128}.
template <class T, int HD>
cudaError_t launch_forward_mma(const ForwardParams& p, cudaStream_t stream);

}  // namespace dtr::cuda::attn
