// Tensor-core forward of the fused attention kernel for bf16 / f16 inputs (FlashAttention-2
// forward, Dao 2023, Algorithm 1, with the warp layout of its Section 3.3: each warp owns 16
// query rows, so the online softmax needs no cross-warp communication).
// One block of 4 warps per (64 query rows, query head, batch). Per key tile of 64:
//   S (16 x 64 per warp) = Q K^T with mma.sync m16n8k16 (bf16/f16 in, f32 accumulate),
//   online softmax on the f32 accumulators, P rounded to the input dtype and reused in
//   registers as the A operand of O += P V (the C -> A fragment identity of m16n8k16).
// Same semantics, masks and outputs as the CUDA-core kernel (attention_forward.cu); the one
// numerical difference is that P is rounded to bf16 / f16 before P V (as in FlashAttention-2);
// l (the softmax denominator) sums the f32 P.
// Fragment layouts: PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type":
// with g = lane / 4, t = lane % 4,
//   A (16 x 16, row): reg0 = A[g][2t, 2t+1], reg1 = A[g+8][2t, 2t+1], reg2 = A[g][2t+8, 2t+9],
//                     reg3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, col):  reg0 = B[2t, 2t+1][g], reg1 = B[2t+8, 2t+9][g]
//   C (16 x 8, f32):  c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
// (the lower-indexed element of a pair in the low 16 bits of a register).
#include "tensor/ops/cuda/attention_tile.cuh"

namespace dtr::cuda::attn {
namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaBlockQ = 16 * kMmaWarps;  // 64 query rows per block
constexpr int kMmaBlockK = 64;              // keys per tile
constexpr int kNBlocksS = kMmaBlockK / 8;   // n-blocks of 8 keys in a score tile

/// Row stride (elements) of a [rows][HD] 16-bit tile: HD + 8 keeps rows 16-byte aligned and
/// shifts consecutive rows by 4 banks.
template <int HD>
constexpr int mma_ld() {
  return HD + 8;
}

template <int HD>
constexpr size_t mma_smem_bytes() {
  return sizeof(uint16_t) * static_cast<size_t>(kMmaBlockQ + 2 * kMmaBlockK) * mma_ld<HD>();
}

/// Loads rows [0, nvalid) of a head (row stride sl, element stride sd, dim elements) into the
/// shared 16-bit tile `dst` [ROWS][HD + 8]; other rows and columns are zero.
template <class T, int HD, int ROWS>
__device__ __forceinline__ void load_tile16(T* dst, const T* src, int64_t sl, int64_t sd, int nvalid, int dim) {
  constexpr int LD = mma_ld<HD>();
  for (int idx = threadIdx.x; idx < ROWS * HD; idx += kMmaThreads) {
    const int r = idx / HD, d = idx % HD;
    dst[r * LD + d] = (r < nvalid && d < dim) ? src[r * sl + d * sd] : from_f32<T>(0.0f);
  }
}

/// Two adjacent 16-bit elements as one register (the first in the low half).
template <class T>
__device__ __forceinline__ uint32_t ld_pair(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
template <class T>
__device__ __forceinline__ uint32_t pack_pair(T lo, T hi) {
  uint16_t l, h;
  memcpy(&l, &lo, 2);
  memcpy(&h, &hi, 2);
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}

/// c += a b for one m16n8k16 tile (a: 16 x 16 row-major, b: 16 x 8 col-major, 16-bit inputs,
/// f32 accumulators), one warp.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
#ifdef DTR_ATTN_EMULATE  // the CPU emulation used to validate these kernels without a GPU
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emu_mma_16816<T>(c, a, b);
}
#else
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

template <class T, int HD>
__global__ void __launch_bounds__(kMmaThreads) sdpa_forward_mma_kernel(const ForwardParams p) {
  constexpr int LD = mma_ld<HD>();
  constexpr int kKSteps = HD / 16;   // k-steps of Q K^T
  constexpr int kNBlocksO = HD / 8;  // n-blocks of 8 output columns
  extern __shared__ float smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kMmaBlockQ * LD;
  T* sV = sK + kMmaBlockK * LD;

  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kMmaBlockQ;
  const int hk = h / (p.Hq / p.Hkv);
  const int nq = min(kMmaBlockQ, p.T - i0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wrow = warp * 16;                       // first tile row of this warp
  const int row_lo = i0 + wrow + g, row_hi = row_lo + 8;  // the two query rows of this thread

  load_tile16<T, HD, kMmaBlockQ>(sQ, head_row<T>(p.q, p.q_stride, b, h, i0), p.q_stride[2], p.q_stride[3], nq, p.D);
  __syncthreads();
  uint32_t qa[kKSteps][4];  // Q fragments of this warp's 16 rows, kept for the whole kernel
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    const T* base = sQ + (wrow + g) * LD + ks * 16 + 2 * t;
    qa[ks][0] = ld_pair(base);
    qa[ks][1] = ld_pair(base + 8 * LD);
    qa[ks][2] = ld_pair(base + 8);
    qa[ks][3] = ld_pair(base + 8 * LD + 8);
  }

  float o[kNBlocksO][4];
#pragma unroll
  for (int nb = 0; nb < kNBlocksO; ++nb) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0.0f;
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.0f, 0.0f};  // rows row_lo, row_hi

  const int jend = key_end(p, i0 + nq);
  for (int j0 = 0; j0 < jend; j0 += kMmaBlockK) {
    const int nk = min(kMmaBlockK, p.S - j0);
    __syncthreads();  // the previous tile's sK / sV are no longer read
    load_tile16<T, HD, kMmaBlockK>(sK, head_row<T>(p.k, p.k_stride, b, hk, j0), p.k_stride[2], p.k_stride[3], nk, p.D);
    load_tile16<T, HD, kMmaBlockK>(sV, head_row<T>(p.v, p.v_stride, b, hk, j0), p.v_stride[2], p.v_stride[3], nk, p.Dv);
    __syncthreads();

    // S = Q K^T: B[k = d][n = key] = K[key][d], so B pairs are adjacent in a K row.
    float s[kNBlocksS][4];
#pragma unroll
    for (int nb = 0; nb < kNBlocksS; ++nb) {
      s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        const T* kb = sK + (nb * 8 + g) * LD + ks * 16 + 2 * t;
        const uint32_t bk[2] = {ld_pair(kb), ld_pair(kb + 8)};
        mma_16816<T>(s[nb], qa[ks], bk);
      }
    }

    // Online softmax on rows row_lo (s[.][0..1]) and row_hi (s[.][2..3]).
    float mloc[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int nb = 0; nb < kNBlocksS; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e < 2 ? row_lo : row_hi, j = j0 + nb * 8 + 2 * t + (e & 1);
        s[nb][e] = visible(p, b, i, j) ? s[nb][e] * p.scale : -CUDART_INF_F;
        mloc[e / 2] = fmaxf(mloc[e / 2], s[nb][e]);
      }
    }
    float alpha[2], rowsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int hrow = 0; hrow < 2; ++hrow) {
      const float mnew = fmaxf(m[hrow], row_max4(mloc[hrow]));
      // A row with nothing visible yet keeps m = -inf and gets P = exp(-inf - 0) = 0 (no NaN
      // from -inf - -inf); alpha = 0 whenever m was -inf (O and l are still 0 then).
      const float mref = mnew == -CUDART_INF_F ? 0.0f : mnew;
      alpha[hrow] = expf(m[hrow] - mref);
      m[hrow] = mnew;
#pragma unroll
      for (int nb = 0; nb < kNBlocksS; ++nb) {
#pragma unroll
        for (int e = 2 * hrow; e < 2 * hrow + 2; ++e) {
          s[nb][e] = expf(s[nb][e] - mref);
          rowsum[hrow] += s[nb][e];
        }
      }
      l[hrow] = l[hrow] * alpha[hrow] + row_sum4(rowsum[hrow]);
    }
#pragma unroll
    for (int nb = 0; nb < kNBlocksO; ++nb) {
      o[nb][0] *= alpha[0];
      o[nb][1] *= alpha[0];
      o[nb][2] *= alpha[1];
      o[nb][3] *= alpha[1];
    }

    // O += P V. A = P (16 x 16 keys of k-step ks) from the score accumulators of n-blocks
    // 2 ks and 2 ks + 1; B[k = key][n = d] = V[key][d]: the pair is two V rows.
#pragma unroll
    for (int ks = 0; ks < kMmaBlockK / 16; ++ks) {
      const uint32_t pa[4] = {
          pack_pair(from_f32<T>(s[2 * ks][0]), from_f32<T>(s[2 * ks][1])),
          pack_pair(from_f32<T>(s[2 * ks][2]), from_f32<T>(s[2 * ks][3])),
          pack_pair(from_f32<T>(s[2 * ks + 1][0]), from_f32<T>(s[2 * ks + 1][1])),
          pack_pair(from_f32<T>(s[2 * ks + 1][2]), from_f32<T>(s[2 * ks + 1][3])),
      };
      const T* vb = sV + (ks * 16 + 2 * t) * LD + g;
#pragma unroll
      for (int nb = 0; nb < kNBlocksO; ++nb) {
        const T* vc = vb + nb * 8;
        const uint32_t bv[2] = {pack_pair(vc[0], vc[LD]), pack_pair(vc[8 * LD], vc[9 * LD])};
        mma_16816<T>(o[nb], pa, bv);
      }
    }
  }

  // Write O / l and LSE (rows that see no key: 0 and -inf).
#pragma unroll
  for (int hrow = 0; hrow < 2; ++hrow) {
    const int i = hrow == 0 ? row_lo : row_hi;
    if (i >= p.T) continue;
    const int64_t row = (static_cast<int64_t>(b) * p.Hq + h) * p.T + i;
    T* out = static_cast<T*>(p.out) + row * p.Dv;
    const float inv = l[hrow] > 0.0f ? 1.0f / l[hrow] : 0.0f;
#pragma unroll
    for (int nb = 0; nb < kNBlocksO; ++nb) {
      const int d = nb * 8 + 2 * t;
      if (d < p.Dv) out[d] = from_f32<T>(o[nb][2 * hrow] * inv);
      if (d + 1 < p.Dv) out[d + 1] = from_f32<T>(o[nb][2 * hrow + 1] * inv);
    }
    if (t == 0) p.lse[row] = l[hrow] > 0.0f ? m[hrow] + logf(l[hrow]) : -CUDART_INF_F;
  }
}

}  // namespace

template <class T, int HD>
cudaError_t launch_forward_mma(const ForwardParams& p, cudaStream_t stream) {
  constexpr size_t smem = mma_smem_bytes<HD>();
  cudaError_t e = cudaFuncSetAttribute(sdpa_forward_mma_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid((p.T + kMmaBlockQ - 1) / kMmaBlockQ, p.Hq, p.B);
  sdpa_forward_mma_kernel<T, HD><<<grid, kMmaThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template cudaError_t launch_forward_mma<__nv_bfloat16, 64>(const ForwardParams&, cudaStream_t);
template cudaError_t launch_forward_mma<__nv_bfloat16, 128>(const ForwardParams&, cudaStream_t);
template cudaError_t launch_forward_mma<__half, 64>(const ForwardParams&, cudaStream_t);
template cudaError_t launch_forward_mma<__half, 128>(const ForwardParams&, cudaStream_t);

}  // namespace dtr::cuda::attn
