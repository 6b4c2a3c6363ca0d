// scaled_dot_product_attention: q [B, Hq, T, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv].
// Op "sdpa" -> {out [B, Hq, T, Dv], lse [B, Hq, T]}: blocked over keys with an online softmax
// (Flash-attention), so only the output and the per-row logsumexp are kept. Op
// "sdpa_backward" recomputes the probabilities blockwise from (q, k, v, out, lse)
// (Flash-attention 2 backward) -> {dq, dk, dv}; dk/dv sum over the query heads of a group.
// Causal mask: key j is visible from query i when j <= i + (S - T) (bottom-right aligned, the
// KV-cache convention of Hugging Face / flash-attn); a query row that sees no key outputs 0.
// Sliding window w > 0 (causal only): key j is visible from query i when also
// j > i + (S - T) - w, i.e. a query sees itself and the w - 1 keys before it (Mistral / Gemma;
// transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window).
// Offsets / document ids (SdpaMask): attr 3 is the causal diagonal q_offset - k_offset (query i
// sees key j <= i + diagonal), inputs 3, 4 (forward) / 6, 7 (backward) the document ids of queries
// and keys; calls without a mask keep the 3-attr, 3-input form.
// Source: Dao et al. 2022 (FlashAttention), Dao 2023 (FlashAttention-2); GQA: Ainslie et al. 2023.
#include <cmath>

#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                                    std::optional<double> scale, int64_t window) {
  return scaled_dot_product_attention(q, k, v, is_causal, scale, window, SdpaMask{});
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                                    std::optional<double> scale, int64_t window, const SdpaMask& mask) {
  DTR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "scaled_dot_product_attention: expected q [B, Hq, T, D], ",
            "k/v [B, Hkv, S, D], got q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  DTR_CHECK(is_floating(q.dtype()) && q.dtype() == k.dtype() && q.dtype() == v.dtype(),
            "scaled_dot_product_attention: q, k, v must share one floating dtype, got ", q.dtype(), ", ", k.dtype(),
            ", ", v.dtype());
  const int64_t B = q.sizes()[0], Hq = q.sizes()[1], T = q.sizes()[2], D = q.sizes()[3], Hkv = k.sizes()[1],
                S = k.sizes()[2];
  DTR_CHECK(k.sizes()[0] == B && v.sizes()[0] == B, "scaled_dot_product_attention: batch sizes differ: q ", q.sizes(),
            ", k ", k.sizes(), ", v ", v.sizes());
  DTR_CHECK(Hkv > 0 && v.sizes()[1] == Hkv && Hq % Hkv == 0,
            "scaled_dot_product_attention: query heads Hq=", Hq, " must be a multiple of key/value heads Hkv=", Hkv,
            " (k ", k.sizes(), ", v ", v.sizes(), ")");
  DTR_CHECK(k.sizes()[3] == D && v.sizes()[2] == S, "scaled_dot_product_attention: shape mismatch: q ", q.sizes(),
            ", k ", k.sizes(), ", v ", v.sizes(), " (need k's head dim = q's and k, v of equal length)");
  DTR_CHECK(window >= 0 && (window == 0 || is_causal), "scaled_dot_product_attention: a sliding window (",
            window, ") needs is_causal and must not be negative");
  const bool offsets = mask.q_offset.has_value() || mask.k_offset != 0;
  DTR_CHECK(!offsets || is_causal, "scaled_dot_product_attention: query / key offsets need is_causal");
  const Tensor& qd = mask.q_document_ids;
  const Tensor kd = mask.k_document_ids.defined() ? mask.k_document_ids : qd;
  const bool docs = qd.defined();
  DTR_CHECK(docs || !mask.k_document_ids.defined(),
            "scaled_dot_product_attention: k_document_ids given without q_document_ids");
  if (docs) {
    DTR_CHECK(qd.dtype() == DType::i64 && qd.sizes() == Shape({B, T}),
              "scaled_dot_product_attention: q_document_ids must be int64 [B, T] = [", B, ", ", T, "], got ",
              qd.dtype(), " ", qd.sizes());
    DTR_CHECK(kd.dtype() == DType::i64 && kd.sizes() == Shape({B, S}),
              "scaled_dot_product_attention: k_document_ids must be int64 [B, S] = [", B, ", ", S, "], got ",
              kd.dtype(), " ", kd.sizes(), mask.k_document_ids.defined() ? "" : " (q_document_ids stand in: S != T)");
  }
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<Attr> attrs{is_causal, sc, window};
  if (offsets) attrs.push_back(mask.q_offset.value_or(mask.k_offset + S - T) - mask.k_offset);
  std::vector<Tensor> extra;  // document ids follow the kernel's tensor inputs
  if (docs) extra = {qd, kd};
  static const OpDef* op = op_def("sdpa");
  std::vector<Tensor> in{q, k, v};
  in.insert(in.end(), extra.begin(), extra.end());
  std::vector<Tensor> outs = dispatch(OpCall{op, in, attrs});
  Tensor out = outs[0];
  if (needs_grad({q, k, v})) {
    record("sdpa", {q, k, v}, out,
           [sq = SavedTensor(q), sk = SavedTensor(k), sv = SavedTensor(v), so = SavedTensor(out.detach()),
            sl = SavedTensor(outs[1]), extra, attrs](const std::vector<Tensor>& g, const std::vector<bool>&) {
             static const OpDef* bw = op_def("sdpa_backward");
             const char* nm = "scaled_dot_product_attention";
             std::vector<Tensor> bin{g[0], sq.get(nm), sk.get(nm), sv.get(nm), so.get(nm), sl.get(nm)};
             bin.insert(bin.end(), extra.begin(), extra.end());
             return dispatch(OpCall{bw, bin, attrs});
           });
  }
  return out;
}

}  // namespace dtr
