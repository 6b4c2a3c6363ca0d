// Forward of the fused attention kernel (FlashAttention-2 forward, Dao 2023, Algorithm 1):
// one block per (query tile, query head, batch), online softmax over key tiles, O(S) memory.
// See attention.cuh for the algorithm, the arithmetic and the thread layout.
#include <type_traits>

#include "tensor/ops/cuda/attention_tile.cuh"

namespace dtr::cuda::attn {
namespace {

template <int HD>
constexpr size_t forward_smem_bytes() {
  // sQ [kBlockQ][LD], sK [kBlockK][LD], sV [kBlockK][LD], sP [kBlockQ][kScoreLd]
  return sizeof(float) * (static_cast<size_t>(kBlockQ + 2 * kBlockK) * tile_ld<HD>() + kBlockQ * kScoreLd);
}

template <class T, int HD>
__global__ void __launch_bounds__(kThreads) sdpa_forward_kernel(const ForwardParams p) {
  constexpr int LD = tile_ld<HD>();
  constexpr int kAccCols = HD / 4;
  extern __shared__ float smem[];
  float* sQ = smem;
  float* sK = sQ + kBlockQ * LD;
  float* sV = sK + kBlockK * LD;
  float* sP = sV + kBlockK * LD;

  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kBlockQ;
  const int hk = h / (p.Hq / p.Hkv);
  const int nq = min(kBlockQ, p.T - i0);
  const int r = threadIdx.x / 4, c4 = threadIdx.x % 4;  // this thread's tile row and lane in the row
  const int i = i0 + r;                                   // its query row

  load_tile<T, HD, kBlockQ>(sQ, head_row<T>(p.q, p.q_stride, b, h, i0), p.q_stride[2], p.q_stride[3], nq, p.D);

  float m = -CUDART_INF_F;  // running row max (the same in the 4 threads of a row)
  float l = 0.0f;           // running row sum of exp(s - m)
  float acc[kAccCols];      // O row, columns c4 + 4 * a
#pragma unroll
  for (int a = 0; a < kAccCols; ++a) acc[a] = 0.0f;

  const int jend = key_end(p, i0 + nq);
  for (int j0 = 0; j0 < jend; j0 += kBlockK) {
    const int nk = min(kBlockK, p.S - j0);
    __syncthreads();  // the previous tile's sK / sV / sP are no longer read
    load_tile<T, HD, kBlockK>(sK, head_row<T>(p.k, p.k_stride, b, hk, j0), p.k_stride[2], p.k_stride[3], nk, p.D);
    load_tile<T, HD, kBlockK>(sV, head_row<T>(p.v, p.v_stride, b, hk, j0), p.v_stride[2], p.v_stride[3], nk, p.Dv);
    __syncthreads();

    // Scores of row r, columns c4 + 4 jj.
    float s[kColsPerThread];
#pragma unroll
    for (int jj = 0; jj < kColsPerThread; ++jj) s[jj] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HD; ++d) {
      const float qd = sQ[r * LD + d];
#pragma unroll
      for (int jj = 0; jj < kColsPerThread; ++jj) s[jj] += qd * sK[(c4 + 4 * jj) * LD + d];
    }
    float mloc = -CUDART_INF_F;
#pragma unroll
    for (int jj = 0; jj < kColsPerThread; ++jj) {
      const int j = j0 + c4 + 4 * jj;
      s[jj] = visible(p, b, i, j) ? s[jj] * p.scale : -CUDART_INF_F;
      mloc = fmaxf(mloc, s[jj]);
    }
    const float mnew = fmaxf(m, row_max4(mloc));
    float rowsum = 0.0f;
    float alpha = 1.0f;
    if (mnew == -CUDART_INF_F) {  // nothing visible yet in this row: P = 0, state unchanged
#pragma unroll
      for (int jj = 0; jj < kColsPerThread; ++jj) sP[r * kScoreLd + c4 + 4 * jj] = 0.0f;
    } else {
      alpha = expf(m - mnew);  // 0 when m was -inf
#pragma unroll
      for (int jj = 0; jj < kColsPerThread; ++jj) {
        const float e = expf(s[jj] - mnew);  // 0 for masked entries
        sP[r * kScoreLd + c4 + 4 * jj] = e;
        rowsum += e;
      }
      m = mnew;
    }
    l = l * alpha + row_sum4(rowsum);
#pragma unroll
    for (int a = 0; a < kAccCols; ++a) acc[a] *= alpha;
    __syncthreads();  // sP complete

    // O row += P row . V
    for (int c = 0; c < kBlockK; ++c) {
      const float pc = sP[r * kScoreLd + c];
#pragma unroll
      for (int a = 0; a < kAccCols; ++a) acc[a] += pc * sV[c * LD + c4 + 4 * a];
    }
  }

  if (i < p.T) {
    T* out = static_cast<T*>(p.out) + ((static_cast<int64_t>(b) * p.Hq + h) * p.T + i) * p.Dv;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // a row that sees no key outputs 0
#pragma unroll
    for (int a = 0; a < kAccCols; ++a) {
      const int d = c4 + 4 * a;
      if (d < p.Dv) out[d] = from_f32<T>(acc[a] * inv);
    }
    if (c4 == 0) p.lse[(static_cast<int64_t>(b) * p.Hq + h) * p.T + i] = l > 0.0f ? m + logf(l) : -CUDART_INF_F;
  }
}

template <class T, int HD>
cudaError_t launch_forward(const ForwardParams& p, cudaStream_t stream) {
  constexpr size_t smem = forward_smem_bytes<HD>();
  cudaError_t e = cudaFuncSetAttribute(sdpa_forward_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid((p.T + kBlockQ - 1) / kBlockQ, p.Hq, p.B);
  sdpa_forward_kernel<T, HD><<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_forward_hd(const ForwardParams& p, cudaStream_t stream) {
  const int hd = p.D > p.Dv ? p.D : p.Dv;
  if constexpr (!std::is_same_v<T, float>) {  // bf16 / f16: tensor cores unless disabled
    if (p.tensor_cores) return hd <= 64 ? launch_forward_mma<T, 64>(p, stream) : launch_forward_mma<T, 128>(p, stream);
  }
  return hd <= 64 ? launch_forward<T, 64>(p, stream) : launch_forward<T, 128>(p, stream);
}

}  // namespace

cudaError_t sdpa_forward(const ForwardParams& p, cudaStream_t stream) {
  if (p.B == 0 || p.Hq == 0 || p.T == 0) return cudaSuccess;  // nothing to compute
  if (p.Hkv <= 0 || p.Hq % p.Hkv != 0 || p.D < 1 || p.Dv < 1 || p.D > kMaxHeadDim || p.Dv > kMaxHeadDim)
    return cudaErrorInvalidValue;
  switch (p.dtype) {
    case ElemType::f32: return launch_forward_hd<float>(p, stream);
    case ElemType::bf16: return launch_forward_hd<__nv_bfloat16>(p, stream);
    case ElemType::f16: return launch_forward_hd<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dtr::cuda::attn
