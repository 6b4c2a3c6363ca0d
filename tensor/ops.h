#pragma once
// Public ops of dtr. Each is one free function that records autograd history (when grad mode
// is on and an input requires grad) and dispatches to the distributed dispatcher or to the
// kernel of (op, device). Backward formulas call these same functions, so they work on
// distributed tensors unchanged. Semantics follow PyTorch's functions of the same name.
// Implementations: ops/*.cpp (one file per op family); kernels: ops/cpu/*.cpp.
#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace dtr {

// ---- factories (ops/factory.cpp) -----------------------------------------------------------
Tensor zeros(const Shape& shape, TensorOptions opt = {});
Tensor ones(const Shape& shape, TensorOptions opt = {});
Tensor full(const Shape& shape, double value, TensorOptions opt = {});
/// [start, end) step `step`; dtype from opt (default f32; pass DType::i64 for indices).
Tensor arange(double start, double end, double step = 1.0, TensorOptions opt = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
/// Random factories use the counter-based Philox generator (tensor/random.h): element i of
/// the result is a pure function of (seed, offset + i), so any slice can be made alone.
Tensor rand(const Shape& shape, TensorOptions opt = {});
Tensor randn(const Shape& shape, TensorOptions opt = {});
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opt = {});
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opt = {});

// ---- views (ops/view.cpp): share storage; backward maps the gradient back ------------------
/// Errors: shape incompatible with numel or strides (use reshape).
Tensor view(const Tensor& x, const Shape& shape);
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const Shape& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
/// Python-style slice [start, end) with step along dim (negative start/end count from the end).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
/// Broadcasts size-1 dims (and new leading dims) to `shape`; -1 keeps a size.
Tensor expand(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor flatten(const Tensor& x, int64_t start = 0, int64_t end = -1);
Tensor contiguous(const Tensor& x);
/// Sums `x` down to `shape` (the inverse of broadcasting); used by broadcasting backward.
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- copies and casts (ops/copy.cpp) ---------------------------------------------------------
Tensor to_dtype(const Tensor& x, DType dt);
Tensor to_device(const Tensor& x, Device d);
Tensor clone(const Tensor& x);

// ---- pointwise (ops/pointwise.cpp): broadcasting like PyTorch ---------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
/// Scalar variants: the scalar is an op attribute (part of the DTensor propagation key).
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);
/// s - a
Tensor rsub(const Tensor& a, double s);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor pow(const Tensor& x, double p);
Tensor abs(const Tensor& x);
Tensor silu(const Tensor& x);
/// tanh approximation when approximate == true, erf form otherwise (PyTorch's GELU).
Tensor gelu(const Tensor& x, bool approximate = false);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
/// cond ? a : b with broadcasting; cond is bool/u8.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
/// Comparisons return bool tensors (no gradient).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, double s);
Tensor lt(const Tensor& a, double s);
Tensor maximum(const Tensor& a, const Tensor& b);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

// ---- in-place (ops/inplace.cpp): bump the version counter; refuse leaves requiring grad ------
Tensor& add_(Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor& mul_(Tensor& a, double s);

// ---- reductions (ops/reduction.cpp) ----------------------------------------------------------
/// Sum over `dims` (all dims when empty).
Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
/// Max over `dims` (values only; gradient to the first maximal element like PyTorch's amax
/// splits evenly among ties).
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
/// Max along one dim: values and int64 indices (torch.max(x, dim)).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
/// Logical and / or over `dims` (all dims when empty), torch.all / torch.any: an element counts
/// as true when it is nonzero (NaN included). Any dtype in, bool out, no gradient. An empty
/// reduction gives true (all) / false (any).
Tensor all(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor any(const Tensor& x, const Shape& dims = {}, bool keepdim = false);

// ---- softmax (ops/softmax.cpp) ---------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

// ---- matrix (ops/matmul.cpp): Eigen GEMM over strided memory -------------------------------
/// [m,k] x [k,n] -> [m,n].
Tensor mm(const Tensor& a, const Tensor& b);
/// [b,m,k] x [b,k,n] -> [b,m,n].
Tensor bmm(const Tensor& a, const Tensor& b);
/// self [m,n] += a [m,k] x b [k,n] in place (torch.Tensor.addmm_ with beta = alpha = 1): the
/// GEMM's accumulate form, no temporary product when self is contiguous. float32 / float64 (the
/// same dtype for all three), one device; no autograd: refused while grad mode is on and any
/// operand requires grad, and when self shares storage with a or b. Bumps self's version.
Tensor& addmm_(Tensor& self, const Tensor& a, const Tensor& b);
/// torch.matmul: 1-D/2-D/batched with broadcasting of batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
/// One GEMM per group of rows (mixture-of-experts experts; torch._grouped_mm with offsets =
/// cumulative group_sizes). a [T, K], b [G, K, N] -> [T, N]: rows [o_g, o_g + n_g) of a times
/// b[g]; or a [K, T], b [T, N] -> [G, K, N]: columns [o_g, o_g + n_g) of a times those rows of
/// b (the weight-gradient form). group_sizes n_g >= 0 (zero allowed), sum = T. Operands may be
/// transposed views. Errors: ranks other than 2x3 / 2x2, G != b.size(0), inner dims or sums
/// that differ, negative sizes, mixed or non-floating dtypes.
Tensor grouped_mm(const Tensor& a, const Tensor& b, const Shape& group_sizes);
/// x [..., in] @ w[out, in]^T (+ bias[out]) -> [..., out].
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

/// LoRA linear y = input W^T + bias + scale * (lora_input A^T) B^T as one autograd node, the
/// adapter term accumulated into the base GEMM's output (addmm_) in the forward and into dinput
/// in the backward. input [..., in], weight [out, in], bias [out] or undefined, lora_a [r, in],
/// lora_b [out, r]; lora_input (same shape as input) is the adapter's input when it differs
/// (LoRA dropout before A), undefined = input. Local tensors of one dtype and device. Errors:
/// shapes that disagree, a DTensor, mixed dtypes. Source: Hu et al. 2021 (ops/nn_lora_linear.cpp).
Tensor lora_linear(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& lora_a,
                   const Tensor& lora_b, double scale, const Tensor& lora_input = Tensor());

// ---- nn functional (ops/nn_*.cpp) ------------------------------------------------------------
/// weight [num, dim], ids int64/int32 of any shape -> [..., dim]. Errors: id out of range.
Tensor embedding(const Tensor& ids, const Tensor& weight);
/// x * rsqrt(mean(x^2, -1) + eps) * weight. Fused kernel. Source: Zhang & Sennrich 2019; HF LlamaRMSNorm.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);
/// Rotary embedding, HF rotate-half layout: x [B, H, T, D], cos/sin [T, D] (or broadcastable).
/// out = x * cos + rotate_half(x) * sin. Source: Su et al. 2021 (RoFormer); HF apply_rotary_pos_emb.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);
/// silu(gate) * up, fused (Llama's MLP gating): gate, up same shape, same floating dtype (no
/// broadcasting). Backward is one fused op: dup = g * silu(gate),
/// dgate = g * up * s * (1 + gate * (1 - s)), s = sigmoid(gate).
/// Errors: shape or dtype mismatch, non-floating dtype.
/// Source: Shazeer 2020 "GLU Variants Improve Transformer"; PyTorch F.silu.
Tensor swiglu(const Tensor& gate, const Tensor& up);
/// cos/sin tables [T, D] for positions [pos0, pos0+T), head dim D, base theta (HF LlamaRotaryEmbedding).
std::pair<Tensor, Tensor> rope_tables(int64_t T, int64_t D, double theta, int64_t pos0 = 0, DType dt = DType::f32);
/// cos/sin tables [B, 1, T, D] for per-token positions position_ids (i64 [B, T], >= 0; packed rows
/// restart at 0 in every document, HF's position_ids): entry [b, 0, t] is rope_tables' row for
/// position position_ids[b, t], so they broadcast against x [B, H, T, D] in rotary_embedding.
/// The tables are built on the CPU and moved to position_ids' device. Errors: not i64 [B, T],
/// a negative position.
std::pair<Tensor, Tensor> rope_tables(const Tensor& position_ids, int64_t D, double theta, DType dt = DType::f32);
/// Masking of scaled_dot_product_attention beyond is_causal / window (every field optional).
///  - Offsets (context parallelism, chunked attention): q_offset / k_offset are the global positions
///    of query row 0 and key row 0; causal: query i sees key j when k_offset + j <= q_offset + i
///    (sliding window: and k_offset + j > q_offset + i - window). Unset q_offset = k_offset + S - T
///    (bottom-right aligned, the KV-cache convention).
///  - Documents (sequence packing): i64 q_document_ids [B, T], k_document_ids [B, S] (undefined =
///    q_document_ids, which needs S == T): query i sees key j only when their ids are equal, so
///    attention never crosses a document (block-diagonal mask; ids need not be sorted, but a
///    sorted row lets the kernels skip blocks). A query that sees no key outputs 0.
/// Source: flash-attn's varlen / cu_seqlens and torchtitan's document-causal FlexAttention mask.
struct SdpaMask {
  std::optional<int64_t> q_offset;
  int64_t k_offset = 0;
  Tensor q_document_ids;
  Tensor k_document_ids;
};
/// Attention. q [B, Hq, T, D], k/v [B, Hkv, S, D] with Hq % Hkv == 0 (GQA); causal mask aligned
/// bottom-right when S > T (KV cache). scale defaults to 1/sqrt(D). `window` > 0 (causal only):
/// sliding-window attention, query i sees keys i + (S - T) - window < j <= i + (S - T).
/// Blocked over keys with an online softmax (Flash-attention style) so memory is O(T*D) per head.
/// Errors: shapes / dtypes that disagree, a negative window or one without is_causal.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal = true,
                                    std::optional<double> scale = std::nullopt, int64_t window = 0);
/// The same with `mask` (offsets, document ids; see SdpaMask). Gradients flow to q, k, v only.
/// Errors: as above; document ids not i64 [B, T] / [B, S]; offsets without is_causal.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                                    std::optional<double> scale, int64_t window, const SdpaMask& mask);
/// Mean cross-entropy over tokens whose target != ignore_index. logits [N, C], targets [N]
/// int64. Fused log-softmax. Errors: a target outside [0, C) other than ignore_index.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
/// cross_entropy(input @ weight^T, targets, ignore_index) without materialising the [N, V]
/// logits: input [N, H], weight [V, H] (same floating dtype; bf16/f16 computed in f32), targets
/// [N] int64/int32 -> mean loss (0-d, input dtype; 0 when every target is ignored). Chunks of
/// `chunk_size` rows (0: automatic, ~256 MiB of f32 logits per chunk); gradients for input /
/// weight are formed chunk by chunk in the forward when needed (backward scales them). DTensor
/// operands take the ops' rules (weight Shard(0): loss parallel, logits never gathered). Errors:
/// shapes or dtypes that disagree, a target outside [0, V) other than ignore_index, chunk_size < 0.
/// Source: Liger kernel's fused linear cross-entropy (ops/nn_linear_cross_entropy.cpp).
Tensor linear_cross_entropy(const Tensor& input, const Tensor& weight, const Tensor& targets,
                            int64_t ignore_index = -100, int64_t chunk_size = 0);
/// Inverted dropout with a Philox mask addressed by (seed, offset + element index).
Tensor dropout(const Tensor& x, double p, bool training);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);
std::vector<Tensor> split_with_sizes(const Tensor& x, const Shape& sizes, int64_t dim);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);

}  // namespace dtr
