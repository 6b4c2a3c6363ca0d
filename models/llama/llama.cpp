// Llama causal LM (see llama.h).
#include "models/llama/llama.h"

#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr {

LlamaConfig llama_debug_config() {
  LlamaConfig c;
  c.vocab_size = 128;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 128;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

int64_t llama_head_dim(const LlamaConfig& c) {
  if (c.head_dim > 0) return c.head_dim;
  DTR_CHECK(c.num_attention_heads > 0, "Llama: num_attention_heads must be positive, got ", c.num_attention_heads);
  return c.hidden_size / c.num_attention_heads;
}

namespace {

Tensor call_child(nn::Module& m, const char* name, const Tensor& x) { return m.get_submodule(name)->call(x); }

}  // namespace

// ---- attention -------------------------------------------------------------------------------

LlamaAttention::LlamaAttention(const LlamaConfig& c, DType dt, bool init)
    : num_heads(c.num_attention_heads),
      num_kv_heads(c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads),
      head_dim(llama_head_dim(c)),
      rope_theta(c.rope_theta) {
  const int64_t h = c.hidden_size;
  register_module("q_proj", std::make_shared<nn::Linear>(h, num_heads * head_dim, c.attention_bias, dt, init));
  register_module("k_proj", std::make_shared<nn::Linear>(h, num_kv_heads * head_dim, c.attention_bias, dt, init));
  register_module("v_proj", std::make_shared<nn::Linear>(h, num_kv_heads * head_dim, c.attention_bias, dt, init));
  register_module("o_proj", std::make_shared<nn::Linear>(num_heads * head_dim, h, c.attention_bias, dt, init));
}

std::pair<Tensor, Tensor> LlamaAttention::rope(int64_t T, DType dt) {
  if (T != rope_T_ || dt != rope_dt_ || !rope_cos_.defined()) {
    NoGradGuard ng;
    std::tie(rope_cos_, rope_sin_) = rope_tables(T, head_dim, rope_theta, 0, dt);
    rope_T_ = T;
    rope_dt_ = dt;
  }
  return {rope_cos_, rope_sin_};
}

Tensor LlamaAttention::forward(const Tensor& x) {
  DTR_CHECK(x.dim() == 3, "LlamaAttention: expected x [B, T, hidden], got ", x.sizes());
  const int64_t B = x.size(0), T = x.size(1), D = head_dim;
  // Head counts follow from the projection widths (-1): local heads under tensor parallelism.
  Tensor q = transpose(view(call_child(*this, "q_proj", x), {B, T, -1, D}), 1, 2);  // [B, Hq, T, D]
  Tensor k = transpose(view(call_child(*this, "k_proj", x), {B, T, -1, D}), 1, 2);  // [B, Hkv, T, D]
  Tensor v = transpose(view(call_child(*this, "v_proj", x), {B, T, -1, D}), 1, 2);
  DTR_CHECK(q.size(1) % k.size(1) == 0, "LlamaAttention: query heads ", q.size(1), " not a multiple of kv heads ",
            k.size(1));
  Tensor cos, sin;
  if (use_cache_) {
    const int64_t past = cache_length();
    NoGradGuard ng;
    std::tie(cos, sin) = rope_tables(T, head_dim, rope_theta, past, q.dtype());
  } else {
    std::tie(cos, sin) = rope(T, q.dtype());
  }
  q = rotary_embedding(q, cos, sin);
  k = rotary_embedding(k, cos, sin);
  if (use_cache_) {
    DTR_CHECK(!x.requires_grad() || !grad_enabled(), "LlamaAttention: the KV cache is for inference only");
    if (k_cache_.defined()) {
      k = cat({k_cache_, k}, 2);
      v = cat({v_cache_, v}, 2);
    }
    k_cache_ = k.contiguous();
    v_cache_ = v.contiguous();
  }
  Tensor o = scaled_dot_product_attention(q, k, v, /*is_causal=*/true);  // [B, Hq, T, D], bottom-right causal
  o = reshape(transpose(o, 1, 2), {B, T, -1});
  return call_child(*this, "o_proj", o);
}

void LlamaAttention::enable_kv_cache(bool on) {
  use_cache_ = on;
  k_cache_ = Tensor();
  v_cache_ = Tensor();
}

void enable_kv_cache(nn::Module& model, bool on) {
  for (auto& [fqn, m] : model.named_modules())
    if (auto* a = dynamic_cast<LlamaAttention*>(m.get())) a->enable_kv_cache(on);
}

// ---- MLP, block, model -------------------------------------------------------------------------

LlamaMLP::LlamaMLP(const LlamaConfig& c, DType dt, bool init) {
  const int64_t h = c.hidden_size, i = c.intermediate_size;
  register_module("gate_proj", std::make_shared<nn::Linear>(h, i, c.mlp_bias, dt, init));
  register_module("up_proj", std::make_shared<nn::Linear>(h, i, c.mlp_bias, dt, init));
  register_module("down_proj", std::make_shared<nn::Linear>(i, h, c.mlp_bias, dt, init));
}

Tensor LlamaMLP::forward(const Tensor& x) {
  // silu(gate) * up as one fused op (one pass forward, one backward).
  Tensor h = swiglu(call_child(*this, "gate_proj", x), call_child(*this, "up_proj", x));
  return call_child(*this, "down_proj", h);
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c, DType dt, bool init) {
  register_module("self_attn", std::make_shared<LlamaAttention>(c, dt, init));
  register_module("mlp", std::make_shared<LlamaMLP>(c, dt, init));
  register_module("input_layernorm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps, dt));
  register_module("post_attention_layernorm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps, dt));
}

Tensor LlamaDecoderLayer::forward(const Tensor& x) {
  Tensor h = add(x, call_child(*this, "self_attn", call_child(*this, "input_layernorm", x)));
  return add(h, call_child(*this, "mlp", call_child(*this, "post_attention_layernorm", h)));
}

LlamaModel::LlamaModel(const LlamaConfig& c, DType dt, bool init) {
  register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size, dt, init));
  auto layers = std::make_shared<nn::ModuleList>();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(std::make_shared<LlamaDecoderLayer>(c, dt, init));
  register_module("layers", layers);
  register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps, dt));
}

std::shared_ptr<nn::ModuleList> LlamaModel::layers() const {
  return std::dynamic_pointer_cast<nn::ModuleList>(const_cast<LlamaModel*>(this)->get_submodule("layers"));
}

Tensor LlamaModel::forward(const Tensor& ids) {
  DTR_CHECK(ids.dim() == 2 && (ids.dtype() == DType::i64 || ids.dtype() == DType::i32),
            "LlamaModel: expected input_ids [B, T] int64/int32, got ", ids.sizes(), " ", ids.dtype());
  Tensor h = call_child(*this, "embed_tokens", ids);
  for (const auto& layer : layers()->children()) h = layer->call(h);
  return call_child(*this, "norm", h);
}

// ---- causal LM ---------------------------------------------------------------------------------

LlamaForCausalLM::LlamaForCausalLM(const LlamaConfig& c, DType dt, bool init, double initializer_range)
    : config_(c) {
  c.validate("LlamaForCausalLM config");
  DTR_CHECK(c.rope_scaling.rope_type.empty() || c.rope_scaling.rope_type == "default",
            "LlamaForCausalLM: rope_scaling type \"", c.rope_scaling.rope_type, "\" is not supported yet (only none)");
  DTR_CHECK(c.hidden_act == "silu", "LlamaForCausalLM: hidden_act \"", c.hidden_act, "\" is not supported (only silu)");
  // Children are built without their own random init: init_weights draws HF's instead.
  auto model = register_module("model", std::make_shared<LlamaModel>(c, dt, /*init=*/false));
  auto head = std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, false, dt, /*init=*/false);
  // Tied: the same Tensor under both names (state_dict lists both, named_parameters once).
  if (c.tie_word_embeddings) head->register_parameter("weight", model->get_parameter("embed_tokens.weight"));
  register_module("lm_head", head);
  if (init) init_weights(initializer_range);
}

std::shared_ptr<LlamaModel> LlamaForCausalLM::model() const {
  return std::dynamic_pointer_cast<LlamaModel>(const_cast<LlamaForCausalLM*>(this)->get_submodule("model"));
}

void LlamaForCausalLM::init_weights(double std) {
  NoGradGuard ng;
  // HF LlamaPreTrainedModel._init_weights: Linear/Embedding weights N(0, std), biases 0,
  // RMSNorm weights 1. Parameters in registration order (tied weights once).
  for (auto& [fqn, p] : named_parameters()) {
    const bool is_norm = fqn.ends_with("norm.weight");
    if (fqn.ends_with(".bias")) p.zero_();
    else if (is_norm) p.fill_(1.0);
    else p.copy_(normal(p.sizes(), 0.0, std, TensorOptions(p.dtype())));
  }
}

Tensor LlamaForCausalLM::forward(const Tensor& ids) {
  return call_child(*this, "lm_head", call_child(*this, "model", ids));
}

Tensor LlamaForCausalLM::forward_loss(const Tensor& ids, const Tensor& labels, bool shift) {
  return causal_lm_loss(call(ids), labels, shift);  // call(): runs the forward hooks (FSDP root, TP)
}

Tensor causal_lm_loss(const Tensor& logits, const Tensor& labels, bool shift, int64_t ignore_index) {
  DTR_CHECK(logits.dim() == 3 && labels.dim() == 2 && logits.size(0) == labels.size(0) &&
                logits.size(1) == labels.size(1),
            "causal_lm_loss: expected logits [B, T, V] and labels [B, T], got ", logits.sizes(), " and ",
            labels.sizes());
  DTR_CHECK(labels.dtype() == DType::i64, "causal_lm_loss: labels must be int64, got ", labels.dtype());
  const int64_t T = logits.size(1), V = logits.size(2);
  Tensor lg = logits, lb = labels;
  if (shift) {
    DTR_CHECK(T >= 2, "causal_lm_loss: shift needs T >= 2, got logits ", logits.sizes());
    lg = slice(logits, 1, 0, T - 1);
    lb = slice(labels, 1, 1, T);
  }
  return cross_entropy(reshape(lg, {-1, V}), reshape(lb, {-1}), ignore_index);
}

}  // namespace dtr
