#pragma once
// Fused scaled-dot-product attention on CUDA: the kernels of ops "sdpa" and "sdpa_backward"
// (same semantics as tensor/ops/cpu/nn_attention_forward.cpp / nn_attention_backward.cpp). Host-only interface: this
// header has no device code, so the op glue (attention.cpp, a plain C++ file) includes it.
//
// Algorithm: FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster Attention with Better
// Parallelism and Work Partitioning", Algorithms 1 and 2; Dao et al. 2022 for the tiling and the
// online softmax). Memory is O(S): the T x S score matrix is never stored.
//   Forward, one thread block per (query tile of 64 rows, query head, batch):
//     Q tile in shared memory; for each key tile of 64 (only those a causal row can see):
//       S = scale * Q K^T; m' = max(m, rowmax S); P = exp(S - m'); l = l e^(m-m') + rowsum P;
//       O = O e^(m-m') + P V.
//     Then O /= l and LSE = m + log l (kept, f32). A row that sees no key: O = 0, LSE = -inf.
//   Backward (recomputes P = exp(scale Q K^T - LSE), never stores it):
//     Di = rowsum(dO * O)                                     (one warp per row)
//     dK/dV: one block per (key tile of 64, kv head, batch); loops over the query heads of
//       its GQA group and the query tiles that can see the key tile:
//         dP = dO V^T; dS = P * (dP - Di); dV += P^T dO; dK += scale dS^T Q
//     dQ: one block per (query tile, query head, batch); loops over key tiles:
//         dQ += scale dS K
//   dQ gets its own kernel (recomputing P and dP) instead of FlashAttention-2's atomicAdd into
//   an f32 dQ buffer: deterministic, no workspace, at the price of a second QK^T / dO V^T.
// Arithmetic: inputs f32 / bf16 / f16 are converted to f32 when a tile is loaded into shared
// memory; all products, sums, exp/log run in f32 (expf / logf, not the fast intrinsics);
// outputs are rounded once to the input dtype (round to nearest even), LSE stays f32.
// Compute: the bf16 / f16 forward runs on tensor cores (attention_forward_mma.cu: mma.sync
// m16n8k16, f32 accumulation, P rounded to the input dtype before P V as in FlashAttention-2);
// the f32 forward and the whole backward run on CUDA cores (attention_forward.cu,
// attention_backward.cu). ForwardParams::tensor_cores = false (env DTR_CUDA_SDPA_SIMPLE=1)
// selects the CUDA-core forward for bf16 / f16 too.
// Head dims: kernels are templated on a padded head dim HD in {64, 128}; D and Dv up to HD are
// zero-padded in shared memory (zeros add nothing to the dot products). D > 128 is rejected.
// Causal mask: key j visible from query i when j <= i + diag, diag = S - T by default (bottom-right
// aligned, the KV-cache convention), so S_q != S_k works; SdpaMask offsets set diag. Document ids
// (q_doc / k_doc): key j visible from query i only when their ids are equal (checked per score;
// no tile skipping on CUDA beyond the causal one). GQA: kv head = q head / (Hq / Hkv).
// Inputs may have any strides (loads are strided, coalesced when the head dim has stride 1).
// Dropout: the CPU op has no dropout attribute, so neither does this one.
#include <cuda_runtime.h>

#include <cstdint>

namespace dtr::cuda::attn {

/// Element type of q, k, v, out (and dO, dq, dk, dv in the backward).
enum class ElemType : int { f32 = 0, bf16 = 1, f16 = 2 };

/// Largest supported head dim (D and Dv).
constexpr int kMaxHeadDim = 128;

/// Arguments of the forward: q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv] with any
/// strides (elements); out [B, Hq, T, Dv] contiguous (ElemType), lse [B, Hq, T] contiguous f32.
struct ForwardParams {
  ElemType dtype = ElemType::f32;
  int B = 0, Hq = 0, Hkv = 0, T = 0, S = 0, D = 0, Dv = 0;
  bool causal = false;
  int window = 0;  // sliding window (causal only); 0 = none
  int diag = 0;    // causal diagonal: query i sees key j <= i + diag
  /// Document ids, contiguous int64 [B, T] / [B, S] on the device; null = no document mask.
  const int64_t* q_doc = nullptr;
  const int64_t* k_doc = nullptr;
  float scale = 1.0f;
  /// bf16 / f16: use the tensor-core kernel (attention_forward_mma.cu); false: the CUDA-core one.
  bool tensor_cores = true;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_stride[4] = {}, k_stride[4] = {}, v_stride[4] = {};
  void* out = nullptr;
  float* lse = nullptr;
};

/// Arguments of the backward: the forward's shapes plus dO (g) and out [B, Hq, T, Dv] and lse
/// [B, Hq, T] (f32) with any strides; outputs dq, dk, dv contiguous, same shapes as q, k, v
/// (ElemType); di: a contiguous f32 workspace of B * Hq * T elements.
struct BackwardParams {
  ElemType dtype = ElemType::f32;
  int B = 0, Hq = 0, Hkv = 0, T = 0, S = 0, D = 0, Dv = 0;
  bool causal = false;
  int window = 0;  // sliding window (causal only); 0 = none
  int diag = 0;    // causal diagonal: query i sees key j <= i + diag
  /// Document ids, contiguous int64 [B, T] / [B, S] on the device; null = no document mask.
  const int64_t* q_doc = nullptr;
  const int64_t* k_doc = nullptr;
  float scale = 1.0f;
  const void* g = nullptr;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const float* lse = nullptr;
  int64_t g_stride[4] = {}, q_stride[4] = {}, k_stride[4] = {}, v_stride[4] = {}, out_stride[4] = {};
  int64_t lse_stride[3] = {};
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* di = nullptr;
};

/// Launches the forward on `stream`. Returns the first CUDA error (launch or configuration).
/// Preconditions (checked by the caller): D, Dv in [1, 128], Hkv > 0, Hq % Hkv == 0, sizes > 0.
cudaError_t sdpa_forward(const ForwardParams& p, cudaStream_t stream);
/// Launches the backward (Di, dK/dV, dQ kernels) on `stream`. Same preconditions.
cudaError_t sdpa_backward(const BackwardParams& p, cudaStream_t stream);

}  // namespace dtr::cuda::attn
