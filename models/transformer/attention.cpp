// Attention shared by the families (see attention.h).
#include "models/transformer/attention.h"

#include <cmath>

#include "models/transformer/causal_lm.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/nn/linear.h"
#include "tensor/nn/rms_norm.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

Tensor call_child(nn::Module& m, const char* name, const Tensor& x) { return m.get_submodule(name)->call(x); }

double softmax_scale(const ModelConfig& c, int64_t head_dim) {
  const double s = c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : static_cast<double>(head_dim);
  return 1.0 / std::sqrt(s);
}

}  // namespace

Attention::Attention(const ModelConfig& c, int64_t layer_idx, DType dt, bool init)
    : num_heads(c.num_attention_heads),
      num_kv_heads(c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads),
      head_dim(llama_head_dim(c)),
      rope_theta(c.is_sliding(layer_idx) ? c.rope_local_base_freq : c.rope_theta),
      window(c.is_sliding(layer_idx) ? c.sliding_window : 0),
      scale(softmax_scale(c, llama_head_dim(c))),
      qk_norm(c.qk_norm),
      prefix_(class_prefix(c)) {
  const int64_t h = c.hidden_size;
  register_module("q_proj", std::make_shared<nn::Linear>(h, num_heads * head_dim, c.qkv_bias, dt, init));
  register_module("k_proj", std::make_shared<nn::Linear>(h, num_kv_heads * head_dim, c.qkv_bias, dt, init));
  register_module("v_proj", std::make_shared<nn::Linear>(h, num_kv_heads * head_dim, c.qkv_bias, dt, init));
  register_module("o_proj", std::make_shared<nn::Linear>(num_heads * head_dim, h, c.o_bias, dt, init));
  if (qk_norm) {
    register_module("q_norm", std::make_shared<nn::RMSNorm>(head_dim, c.rms_norm_eps, dt, c.norm_offset));
    register_module("k_norm", std::make_shared<nn::RMSNorm>(head_dim, c.rms_norm_eps, dt, c.norm_offset));
  }
}

std::pair<Tensor, Tensor> Attention::rope(int64_t T, DType dt) {
  if (T != rope_T_ || dt != rope_dt_ || !rope_cos_.defined()) {
    NoGradGuard ng;
    if (cp_) {  // the slice's two chunks: global positions [r c, (r + 1) c), [(2P - 1 - r) c, (2P - r) c)
      const std::vector<int64_t> pos = context_parallel_positions(T, cp_->size(), cp_->rank());
      auto [c0, s0] = rope_tables(T / 2, head_dim, rope_theta, pos.front(), dt);
      auto [c1, s1] = rope_tables(T / 2, head_dim, rope_theta, pos[T / 2], dt);
      rope_cos_ = cat({c0, c1}, 0);
      rope_sin_ = cat({s0, s1}, 0);
    } else {
      std::tie(rope_cos_, rope_sin_) = rope_tables(T, head_dim, rope_theta, 0, dt);
    }
    rope_T_ = T;
    rope_dt_ = dt;
  }
  return {rope_cos_, rope_sin_};
}

Tensor Attention::forward(const Tensor& x) {
  DTR_CHECK(x.dim() == 3, type_name(), ": expected x [B, T, hidden], got ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), D = head_dim;
  // Head counts follow from the projection widths (-1): local heads under tensor parallelism.
  Tensor q = view(call_child(*this, "q_proj", x), {B, T, -1, D});  // [B, T, Hq, D]
  Tensor k = view(call_child(*this, "k_proj", x), {B, T, -1, D});  // [B, T, Hkv, D]
  Tensor v = view(call_child(*this, "v_proj", x), {B, T, -1, D});
  if (qk_norm) {  // per head, over D (HF: q_norm(q_proj(x).view(B, T, -1, D)))
    q = call_child(*this, "q_norm", q);
    k = call_child(*this, "k_norm", k);
  }
  q = transpose(q, 1, 2);  // [B, Hq, T, D]
  k = transpose(k, 1, 2);
  v = transpose(v, 1, 2);
  DTR_CHECK(q.size(1) % k.size(1) == 0, type_name(), ": query heads ", q.size(1), " not a multiple of kv heads ",
            k.size(1));
  Tensor cos, sin;
  DTR_CHECK(!(use_cache_ && cp_), type_name(), ": the KV cache (generation) does not run under context parallelism");
  const bool docs = document_ids_.defined();
  if (docs) {
    DTR_CHECK(!use_cache_, type_name(), ": documents (sequence packing) and the KV cache do not combine");
    DTR_CHECK(position_ids_.sizes() == Shape({B, T}) && document_ids_.sizes() == Shape({B, T}), type_name(),
              ": position_ids ", position_ids_.sizes(), " / document_ids ", document_ids_.sizes(),
              " must be [B, T] of x ", x.sizes());
    if (!doc_cos_.defined() || doc_dt_ != q.dtype()) {
      NoGradGuard ng;
      std::tie(doc_cos_, doc_sin_) = rope_tables(position_ids_, head_dim, rope_theta, q.dtype());  // [B, 1, T, D]
      doc_dt_ = q.dtype();
    }
    cos = doc_cos_;
    sin = doc_sin_;
  } else if (use_cache_) {
    const int64_t past = cache_length();
    NoGradGuard ng;
    std::tie(cos, sin) = rope_tables(T, head_dim, rope_theta, past, q.dtype());
  } else {
    std::tie(cos, sin) = rope(T, q.dtype());
  }
  if (cos.device() != q.device()) {  // the tables are made on the host: moved once per length / dtype
    cos = cos.to(q.device());
    sin = sin.to(q.device());
    if (docs) std::tie(doc_cos_, doc_sin_) = std::make_pair(cos, sin);
    else if (!use_cache_) std::tie(rope_cos_, rope_sin_) = std::make_pair(cos, sin);
  }
  q = rotary_embedding(q, cos, sin);
  k = rotary_embedding(k, cos, sin);
  if (use_cache_) {
    DTR_CHECK(!x.requires_grad() || !grad_enabled(), type_name(), ": the KV cache is for inference only");
    if (k_cache_.defined()) {
      k = cat({k_cache_, k}, 2);
      v = cat({v_cache_, v}, 2);
    }
    k_cache_ = k.contiguous();
    v_cache_ = v.contiguous();
  }
  // [B, Hq, T, D], causal aligned bottom-right; the window (if any) counts from each query back;
  // with documents, within each document only.
  // Context parallelism: the same over the whole sequences of the cp group (global positions).
  SdpaMask mask;
  if (docs) mask.q_document_ids = document_ids_.device() == q.device() ? document_ids_ : document_ids_.to(q.device());
  Tensor o = cp_ ? context_parallel_attention(q, k, v, cp_, /*is_causal=*/true, scale, window, mask.q_document_ids)
                 : scaled_dot_product_attention(q, k, v, /*is_causal=*/true, scale, window, mask);
  o = reshape(transpose(o, 1, 2), {B, T, -1});
  return call_child(*this, "o_proj", o);
}

void Attention::enable_kv_cache(bool on) {
  use_cache_ = on;
  k_cache_ = Tensor();
  v_cache_ = Tensor();
}

void Attention::set_context_parallel(std::shared_ptr<ProcessGroup> cp_group) {
  cp_ = cp_group && cp_group->size() > 1 ? std::move(cp_group) : nullptr;
  rope_cos_ = rope_sin_ = Tensor();  // positions change
}

void Attention::set_documents(const Tensor& position_ids, const Tensor& document_ids) {
  DTR_CHECK(position_ids.defined() == document_ids.defined(), type_name(),
            ": set_documents needs both position_ids and document_ids (or neither)");
  DTR_CHECK(!position_ids.defined() || (position_ids.dtype() == DType::i64 && document_ids.dtype() == DType::i64),
            type_name(), ": position_ids / document_ids must be int64, got ", position_ids.dtype(), " / ",
            document_ids.dtype());
  position_ids_ = position_ids;
  document_ids_ = document_ids;
  doc_cos_ = doc_sin_ = Tensor();
}

void set_attention_documents(nn::Module& model, const Tensor& position_ids, const Tensor& document_ids) {
  for (auto& [fqn, m] : model.named_modules())
    if (auto* a = dynamic_cast<Attention*>(m.get())) a->set_documents(position_ids, document_ids);
}

void enable_kv_cache(nn::Module& model, bool on) {
  for (auto& [fqn, m] : model.named_modules())
    if (auto* a = dynamic_cast<Attention*>(m.get())) a->enable_kv_cache(on);
}

}  // namespace dtr
