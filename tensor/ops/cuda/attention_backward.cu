// Backward of the fused attention kernel (FlashAttention-2 backward, Dao 2023, Algorithm 2),
// as three kernels on one stream:
//   di_kernel:   Di = rowsum(dO * O), f32                          (one warp per query row)
//   dkdv_kernel: one block per (key tile, kv head, batch) owns its dK / dV rows and loops over
//                the query heads of its GQA group and the query tiles that see the key tile
//   dq_kernel:   one block per (query tile, query head, batch) owns its dQ rows and loops over
//                the key tiles its rows see
// Each output element is written by exactly one thread (no atomics: deterministic).
// P = exp(scale q.k - LSE) is recomputed from the forward's LSE; dS = P * (dO.v - Di).
// See attention.cuh for the algorithm, the arithmetic and the thread layout.
#include "tensor/ops/cuda/attention_tile.cuh"

namespace dtr::cuda::attn {
namespace {

constexpr int kWarpsPerDiBlock = kThreads / 32;

template <class T>
__global__ void __launch_bounds__(kThreads) di_kernel(const BackwardParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerDiBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = static_cast<int64_t>(p.B) * p.Hq * p.T;
  if (row >= rows) return;  // whole warps leave together
  const int i = static_cast<int>(row % p.T);
  const int h = static_cast<int>((row / p.T) % p.Hq);
  const int b = static_cast<int>(row / (static_cast<int64_t>(p.T) * p.Hq));
  const T* g = head_row<T>(p.g, p.g_stride, b, h, i);
  const T* o = head_row<T>(p.out, p.out_stride, b, h, i);
  float sum = 0.0f;
  for (int d = lane; d < p.Dv; d += 32) sum += to_f32(g[d * p.g_stride[3]]) * to_f32(o[d * p.out_stride[3]]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) p.di[row] = sum;
}

/// Shared state of one query tile in the backward: Q, dO, LSE and Di of rows [i0, i0 + nq) of
/// query head h (rows beyond nq: zeros and LSE = -inf, so they contribute P = dS = 0).
template <class T, int HD>
__device__ __forceinline__ void load_query_tile(const BackwardParams& p, int b, int h, int i0, float* sQ, float* sdO,
                                                float* sL, float* sDi) {
  const int nq = min(kBlockQ, p.T - i0);
  load_tile<T, HD, kBlockQ>(sQ, head_row<T>(p.q, p.q_stride, b, h, i0), p.q_stride[2], p.q_stride[3], nq, p.D);
  load_tile<T, HD, kBlockQ>(sdO, head_row<T>(p.g, p.g_stride, b, h, i0), p.g_stride[2], p.g_stride[3], nq, p.Dv);
  for (int r = threadIdx.x; r < kBlockQ; r += kThreads) {
    const bool ok = r < nq;
    sL[r] = ok ? p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + (i0 + r) * p.lse_stride[2]] : -CUDART_INF_F;
    sDi[r] = ok ? p.di[(static_cast<int64_t>(b) * p.Hq + h) * p.T + i0 + r] : 0.0f;
  }
}

/// Score phase shared by both kernels (batch row b): for tile row r = threadIdx.x / 4 and the 16 key columns
/// c = c4 + 4 jj, writes dS = P * (dO.v - Di) to sdS[r][c] and, when sP is not null, P to sP[r][c].
/// P = exp(scale q.k - LSE) where key j0 + c is visible from query i0 + r and LSE is finite, else 0.
template <int HD>
__device__ __forceinline__ void score_phase(const BackwardParams& p, int b, int i0, int j0, const float* sQ, const float* sdO,
                                            const float* sK, const float* sV, const float* sL, const float* sDi,
                                            float* sP, float* sdS) {
  constexpr int LD = tile_ld<HD>();
  const int r = threadIdx.x / 4, c4 = threadIdx.x % 4;
  float qk[kColsPerThread], dp[kColsPerThread];
#pragma unroll
  for (int jj = 0; jj < kColsPerThread; ++jj) qk[jj] = dp[jj] = 0.0f;
#pragma unroll 4
  for (int d = 0; d < HD; ++d) {
    const float qd = sQ[r * LD + d], gd = sdO[r * LD + d];
#pragma unroll
    for (int jj = 0; jj < kColsPerThread; ++jj) {
      const int c = c4 + 4 * jj;
      qk[jj] += qd * sK[c * LD + d];
      dp[jj] += gd * sV[c * LD + d];
    }
  }
  const float lse = sL[r], di = sDi[r];
  const int i = i0 + r;
#pragma unroll
  for (int jj = 0; jj < kColsPerThread; ++jj) {
    const int c = c4 + 4 * jj;
    const bool on = lse != -CUDART_INF_F && visible(p, b, i, j0 + c);
    const float pr = on ? expf(qk[jj] * p.scale - lse) : 0.0f;
    if (sP) sP[r * kScoreLd + c] = pr;
    sdS[r * kScoreLd + c] = pr * (dp[jj] - di);
  }
}

template <int HD>
constexpr size_t dkdv_smem_bytes() {
  // sK, sV [kBlockK][LD]; sQ, sdO [kBlockQ][LD]; sP, sdS [kBlockQ][kScoreLd]; sL, sDi [kBlockQ]
  return sizeof(float) * (static_cast<size_t>(2 * kBlockK + 2 * kBlockQ) * tile_ld<HD>() +
                          2 * kBlockQ * kScoreLd + 2 * kBlockQ);
}

template <class T, int HD>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const BackwardParams p) {
  constexpr int LD = tile_ld<HD>();
  constexpr int kAccCols = HD / 4;
  extern __shared__ float smem[];
  float* sK = smem;
  float* sV = sK + kBlockK * LD;
  float* sQ = sV + kBlockK * LD;
  float* sdO = sQ + kBlockQ * LD;
  float* sP = sdO + kBlockQ * LD;
  float* sdS = sP + kBlockQ * kScoreLd;
  float* sL = sdS + kBlockQ * kScoreLd;
  float* sDi = sL + kBlockQ;

  const int b = blockIdx.z, hk = blockIdx.y, j0 = blockIdx.x * kBlockK;
  const int group = p.Hq / p.Hkv;
  const int nk = min(kBlockK, p.S - j0);
  const int kc = threadIdx.x / 4, c4 = threadIdx.x % 4;  // this thread's key row of the tile, lane in row

  load_tile<T, HD, kBlockK>(sK, head_row<T>(p.k, p.k_stride, b, hk, j0), p.k_stride[2], p.k_stride[3], nk, p.D);
  load_tile<T, HD, kBlockK>(sV, head_row<T>(p.v, p.v_stride, b, hk, j0), p.v_stride[2], p.v_stride[3], nk, p.Dv);

  float dk[kAccCols], dv[kAccCols];
#pragma unroll
  for (int a = 0; a < kAccCols; ++a) dk[a] = dv[a] = 0.0f;

  // Causal: query i sees key j0 iff i >= j0 - diag; earlier query tiles see none of this tile.
  int i_first = p.causal ? j0 - p.diag : 0;
  if (i_first < 0) i_first = 0;
  const int i_begin = (i_first / kBlockQ) * kBlockQ;
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    for (int i0 = i_begin; i0 < p.T; i0 += kBlockQ) {
      __syncthreads();  // the previous query tile is no longer read (and sK / sV are loaded)
      load_query_tile<T, HD>(p, b, h, i0, sQ, sdO, sL, sDi);
      __syncthreads();
      score_phase<HD>(p, b, i0, j0, sQ, sdO, sK, sV, sL, sDi, sP, sdS);
      __syncthreads();
      // dV row kc += P[:, kc]^T dO;  dK row kc += dS[:, kc]^T Q  (scale applied at the end)
      for (int r = 0; r < kBlockQ; ++r) {
        const float pr = sP[r * kScoreLd + kc], ds = sdS[r * kScoreLd + kc];
#pragma unroll
        for (int a = 0; a < kAccCols; ++a) {
          const int d = c4 + 4 * a;
          dv[a] += pr * sdO[r * LD + d];
          dk[a] += ds * sQ[r * LD + d];
        }
      }
    }
  }

  if (kc < nk) {
    const int64_t row = (static_cast<int64_t>(b) * p.Hkv + hk) * p.S + j0 + kc;
    T* dK = static_cast<T*>(p.dk) + row * p.D;
    T* dV = static_cast<T*>(p.dv) + row * p.Dv;
#pragma unroll
    for (int a = 0; a < kAccCols; ++a) {
      const int d = c4 + 4 * a;
      if (d < p.D) dK[d] = from_f32<T>(dk[a] * p.scale);
      if (d < p.Dv) dV[d] = from_f32<T>(dv[a]);
    }
  }
}

template <int HD>
constexpr size_t dq_smem_bytes() {
  // sQ, sdO [kBlockQ][LD]; sK, sV [kBlockK][LD]; sdS [kBlockQ][kScoreLd]; sL, sDi [kBlockQ]
  return sizeof(float) * (static_cast<size_t>(2 * kBlockQ + 2 * kBlockK) * tile_ld<HD>() + kBlockQ * kScoreLd +
                          2 * kBlockQ);
}

template <class T, int HD>
__global__ void __launch_bounds__(kThreads) dq_kernel(const BackwardParams p) {
  constexpr int LD = tile_ld<HD>();
  constexpr int kAccCols = HD / 4;
  extern __shared__ float smem[];
  float* sQ = smem;
  float* sdO = sQ + kBlockQ * LD;
  float* sK = sdO + kBlockQ * LD;
  float* sV = sK + kBlockK * LD;
  float* sdS = sV + kBlockK * LD;
  float* sL = sdS + kBlockQ * kScoreLd;
  float* sDi = sL + kBlockQ;

  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kBlockQ;
  const int hk = h / (p.Hq / p.Hkv);
  const int nq = min(kBlockQ, p.T - i0);
  const int r = threadIdx.x / 4, c4 = threadIdx.x % 4;

  load_query_tile<T, HD>(p, b, h, i0, sQ, sdO, sL, sDi);

  float dq[kAccCols];
#pragma unroll
  for (int a = 0; a < kAccCols; ++a) dq[a] = 0.0f;

  const int jend = key_end(p, i0 + nq);
  for (int j0 = 0; j0 < jend; j0 += kBlockK) {
    const int nk = min(kBlockK, p.S - j0);
    __syncthreads();  // the previous key tile and sdS are no longer read (and the query tile is loaded)
    load_tile<T, HD, kBlockK>(sK, head_row<T>(p.k, p.k_stride, b, hk, j0), p.k_stride[2], p.k_stride[3], nk, p.D);
    load_tile<T, HD, kBlockK>(sV, head_row<T>(p.v, p.v_stride, b, hk, j0), p.v_stride[2], p.v_stride[3], nk, p.Dv);
    __syncthreads();
    score_phase<HD>(p, b, i0, j0, sQ, sdO, sK, sV, sL, sDi, nullptr, sdS);
    __syncthreads();
    // dQ row r += dS row . K  (scale applied at the end)
    for (int c = 0; c < kBlockK; ++c) {
      const float ds = sdS[r * kScoreLd + c];
#pragma unroll
      for (int a = 0; a < kAccCols; ++a) dq[a] += ds * sK[c * LD + c4 + 4 * a];
    }
  }

  const int i = i0 + r;
  if (i < p.T) {
    T* dQ = static_cast<T*>(p.dq) + ((static_cast<int64_t>(b) * p.Hq + h) * p.T + i) * p.D;
#pragma unroll
    for (int a = 0; a < kAccCols; ++a) {
      const int d = c4 + 4 * a;
      if (d < p.D) dQ[d] = from_f32<T>(dq[a] * p.scale);
    }
  }
}

template <class T, int HD>
cudaError_t launch_backward(const BackwardParams& p, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.B) * p.Hq * p.T;
  if (rows > 0) {
    const int64_t blocks = (rows + kWarpsPerDiBlock - 1) / kWarpsPerDiBlock;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    di_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (p.S > 0) {  // dK / dV (all zero when T == 0 or Hq == 0)
    constexpr size_t smem = dkdv_smem_bytes<HD>();
    cudaError_t e = cudaFuncSetAttribute(dkdv_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    const dim3 grid((p.S + kBlockK - 1) / kBlockK, p.Hkv, p.B);
    dkdv_kernel<T, HD><<<grid, kThreads, smem, stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (p.T > 0 && p.Hq > 0) {  // dQ (all zero when S == 0)
    constexpr size_t smem = dq_smem_bytes<HD>();
    cudaError_t e = cudaFuncSetAttribute(dq_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    const dim3 grid((p.T + kBlockQ - 1) / kBlockQ, p.Hq, p.B);
    dq_kernel<T, HD><<<grid, kThreads, smem, stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class T>
cudaError_t launch_backward_hd(const BackwardParams& p, cudaStream_t stream) {
  const int hd = p.D > p.Dv ? p.D : p.Dv;
  return hd <= 64 ? launch_backward<T, 64>(p, stream) : launch_backward<T, 128>(p, stream);
}

}  // namespace

cudaError_t sdpa_backward(const BackwardParams& p, cudaStream_t stream) {
  if (p.B == 0 || (p.Hq == 0 && p.Hkv == 0)) return cudaSuccess;  // empty outputs
  if (p.Hkv <= 0 || p.Hq % p.Hkv != 0 || p.D < 1 || p.Dv < 1 || p.D > kMaxHeadDim || p.Dv > kMaxHeadDim)
    return cudaErrorInvalidValue;
  switch (p.dtype) {
    case ElemType::f32: return launch_backward_hd<float>(p, stream);
    case ElemType::bf16: return launch_backward_hd<__nv_bfloat16>(p, stream);
    case ElemType::f16: return launch_backward_hd<__half>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dtr::cuda::attn
