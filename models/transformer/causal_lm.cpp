// The causal LM shared by the families (see causal_lm.h).
#include "models/transformer/causal_lm.h"

#include <cmath>

#include "dtensor/api.h"
#include "models/transformer/family.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr {

int64_t llama_head_dim(const ModelConfig& c) {
  if (c.head_dim > 0) return c.head_dim;
  DTR_CHECK(c.num_attention_heads > 0, "Llama: num_attention_heads must be positive, got ", c.num_attention_heads);
  return c.hidden_size / c.num_attention_heads;
}

std::string class_prefix(const ModelConfig& c) { return model_family(c.model_type).class_prefix; }

nn::MoEConfig moe_config(const ModelConfig& c) {
  nn::MoEConfig m;
  m.hidden_size = c.hidden_size;
  m.moe_intermediate_size = c.moe_intermediate_size;
  m.num_experts = c.num_experts;
  m.num_experts_per_tok = c.num_experts_per_tok;
  m.norm_topk_prob = c.norm_topk_prob;
  m.hidden_act = c.hidden_act;
  return m;
}

double embedding_scale(const ModelConfig& c) {
  // HF Gemma3TextScaledWordEmbedding: sqrt(hidden) as a float32 tensor, cast to the weight dtype.
  return c.scale_embeddings ? static_cast<double>(static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size))))
                            : 0.0;
}

Tensor softcap_logits(const ModelConfig& c, const Tensor& logits) {
  const double cap = c.final_logit_softcapping;
  return cap > 0 ? mul(tanh(div(logits, cap)), cap) : logits;
}

namespace {

Tensor call_child(nn::Module& m, const char* name, const Tensor& x) { return m.get_submodule(name)->call(x); }

}  // namespace

// ---- block, model -----------------------------------------------------------------------------

DecoderLayer::DecoderLayer(const ModelConfig& c, int64_t layer_idx, DType dt, bool init)
    : prefix_(class_prefix(c)), sandwich_(c.sandwich_norms) {
  auto norm = [&] { return std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps, dt, c.norm_offset); };
  register_module("self_attn", std::make_shared<Attention>(c, layer_idx, dt, init));
  if (c.is_moe_layer(layer_idx)) register_module("mlp", std::make_shared<nn::MoE>(moe_config(c), dt, init));
  else register_module("mlp", std::make_shared<GatedMLP>(c, dt, init));
  register_module("input_layernorm", norm());
  register_module("post_attention_layernorm", norm());
  if (sandwich_) {
    register_module("pre_feedforward_layernorm", norm());
    register_module("post_feedforward_layernorm", norm());
  }
}

Tensor DecoderLayer::forward(const Tensor& x) {
  if (!sandwich_) {
    Tensor h = add(x, call_child(*this, "self_attn", call_child(*this, "input_layernorm", x)));
    return add(h, call_child(*this, "mlp", call_child(*this, "post_attention_layernorm", h)));
  }
  Tensor a = call_child(*this, "self_attn", call_child(*this, "input_layernorm", x));
  Tensor h = add(x, call_child(*this, "post_attention_layernorm", a));
  Tensor m = call_child(*this, "mlp", call_child(*this, "pre_feedforward_layernorm", h));
  return add(h, call_child(*this, "post_feedforward_layernorm", m));
}

DecoderModel::DecoderModel(const ModelConfig& c, DType dt, bool init)
    : prefix_(class_prefix(c)),
      embed_scale_(embedding_scale(c)) {
  register_module("embed_tokens", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size, dt, init));
  auto layers = std::make_shared<nn::ModuleList>();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(std::make_shared<DecoderLayer>(c, i, dt, init));
  register_module("layers", layers);
  register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps, dt, c.norm_offset));
}

std::shared_ptr<nn::ModuleList> DecoderModel::layers() const {
  return std::dynamic_pointer_cast<nn::ModuleList>(const_cast<DecoderModel*>(this)->get_submodule("layers"));
}

Tensor DecoderModel::forward(const Tensor& ids) {
  DTR_CHECK(ids.dim() == 2 && (ids.dtype() == DType::i64 || ids.dtype() == DType::i32),
            type_name(), ": expected input_ids [B, T] int64/int32, got ", ids.sizes(), " ", ids.dtype());
  Tensor h = call_child(*this, "embed_tokens", ids);
  if (embed_scale_ > 0) h = mul(h, embed_scale_);
  for (const auto& layer : layers()->children()) h = layer->call(h);
  return call_child(*this, "norm", h);
}

// ---- causal LM ---------------------------------------------------------------------------------

CausalLM::CausalLM(const ModelConfig& c, DType dt, bool init, double initializer_range) : config_(c) {
  const std::string name = class_prefix(c) + "ForCausalLM";
  c.validate(name + " config");
  DTR_CHECK(c.rope_scaling.rope_type.empty() || c.rope_scaling.rope_type == "default", name, ": rope_scaling type \"",
            c.rope_scaling.rope_type, "\" is not supported yet (only none)");
  // Children are built without their own random init: init_weights draws HF's instead.
  auto model = register_module("model", std::make_shared<DecoderModel>(c, dt, /*init=*/false));
  auto head = std::make_shared<nn::Linear>(c.hidden_size, c.vocab_size, false, dt, /*init=*/false);
  // Tied: the same Tensor under both names (state_dict lists both, named_parameters once).
  if (c.tie_word_embeddings) head->register_parameter("weight", model->get_parameter("embed_tokens.weight"));
  register_module("lm_head", head);
  if (init) init_weights(initializer_range);
}

std::shared_ptr<DecoderModel> CausalLM::model() const {
  return std::dynamic_pointer_cast<DecoderModel>(const_cast<CausalLM*>(this)->get_submodule("model"));
}

void CausalLM::init_weights(double std) {
  NoGradGuard ng;
  // HF *PreTrainedModel._init_weights: Linear/Embedding weights N(0, std), biases 0, RMSNorm
  // weights 1 (Gemma's (1 + weight) norms: 0). Parameters in registration order (tied weights once).
  for (auto& [fqn, p] : named_parameters()) {
    const bool is_norm = fqn.ends_with("norm.weight");
    if (fqn.ends_with(".bias")) p.zero_();
    else if (is_norm) p.fill_(config_.norm_offset ? 0.0 : 1.0);
    else p.copy_(normal(p.sizes(), 0.0, std, TensorOptions(p.dtype())));
  }
}

Tensor CausalLM::forward(const Tensor& ids) {
  return softcap_logits(config_, call_child(*this, "lm_head", call_child(*this, "model", ids)));
}

std::vector<Tensor> CausalLM::forward_list(const std::vector<Tensor>& inputs) {
  if (inputs.size() == 1) return {forward(inputs[0])};
  DTR_CHECK(inputs.size() == 2, type_name(), ": expected {input_ids} or {input_ids, targets}, got ", inputs.size(),
            " inputs");
  const Tensor& ids = inputs[0];
  const Tensor& targets = inputs[1];
  DTR_CHECK(targets.dim() == 2 && ids.dim() == 2 && targets.size(0) == ids.size(0) && targets.size(1) == ids.size(1),
            type_name(), ": targets must be [B, T] like input_ids ", ids.sizes(), ", got ", targets.sizes());
  DTR_CHECK(targets.dtype() == DType::i64, type_name(), ": targets must be int64, got ", targets.dtype());
  return {lm_head_loss(config_, *get_submodule("lm_head"), call_child(*this, "model", ids), targets)};
}

Tensor lm_head_loss(const ModelConfig& c, nn::Module& head, const Tensor& h, const Tensor& targets) {
  auto* lin = dynamic_cast<nn::Linear*>(&head);
  if (c.final_logit_softcapping <= 0 && lin && lin->type_name() == "Linear" && !lin->bias().defined())
    return head.call_list({h, targets}).at(0);
  Tensor logits = softcap_logits(c, head.call(h));
  return cross_entropy(reshape(logits, {-1, logits.size(-1)}), reshape(targets, {-1}));
}

Tensor CausalLM::forward_loss(const Tensor& ids, const Tensor& labels, bool shift) {
  Tensor loss = causal_lm_loss(*this, ids, labels, shift);  // call_list(): runs the forward hooks (FSDP root, TP)
  // MoE families: + router_aux_loss_coef * load-balancing loss over the layers (HF with
  // output_router_logits).
  // The loss is a DTensor under loss parallelism, the aux loss a plain tensor of the local tokens:
  // add them as plain tensors, or the router's gradient would come back distributed.
  if (Tensor aux = nn::moe_auxiliary_loss(*this, config_.router_aux_loss_coef, 0.0); aux.defined())
    loss = add(loss.is_distributed() ? full_tensor(loss) : loss, aux.to(loss.dtype()));
  return loss;
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

Tensor causal_lm_loss(nn::Module& model, const Tensor& ids, const Tensor& labels, bool shift) {
  if (!dynamic_cast<CausalLM*>(&model)) return causal_lm_loss(model.call(ids), labels, shift);
  DTR_CHECK(ids.dim() == 2 && labels.dim() == 2 && ids.size(0) == labels.size(0) && ids.size(1) == labels.size(1),
            "causal_lm_loss: expected input_ids [B, T] and labels [B, T], got ", ids.sizes(), " and ", labels.sizes());
  DTR_CHECK(labels.dtype() == DType::i64, "causal_lm_loss: labels must be int64, got ", labels.dtype());
  Tensor targets = labels;
  if (shift) {
    const int64_t B = labels.size(0), T = labels.size(1);
    DTR_CHECK(T >= 2, "causal_lm_loss: shift needs T >= 2, got labels ", labels.sizes());
    targets = cat({slice(labels, 1, 1, T), full({B, 1}, -100.0, TensorOptions(DType::i64).with_device(labels.device()))},
                  1);
  }
  return model.call_list({ids, targets}).at(0);
}

}  // namespace dtr
