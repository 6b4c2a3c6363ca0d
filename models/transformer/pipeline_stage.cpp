// Causal-LM pipeline stages (see pipeline_stage.h).
#include "models/transformer/pipeline_stage.h"

#include "parallel/pipeline/stage_split.h"
#include "tensor/nn/module_list.h"
#include "tensor/ops.h"

namespace dtr {

CausalLMStage::CausalLMStage(CausalLM& full, int64_t b, int64_t e, bool first, bool last)
    : config_(full.config()), first_(first), last_(last), begin_(b), end_(e) {
  auto src = full.model();
  auto layers = src->layers();
  const int64_t n = static_cast<int64_t>(layers->size());
  DTR_CHECK(0 <= b && b < e && e <= n, "CausalLMStage: layer range [", b, ", ", e, ") of ", n, " layers");
  auto model = register_module("model", std::make_shared<nn::Module>());
  if (first) model->register_module("embed_tokens", src->get_submodule("embed_tokens"));
  auto mine = model->register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = b; i < e; ++i) mine->register_module(std::to_string(i), (*layers)[i]);
  if (last) {
    model->register_module("norm", src->get_submodule("norm"));
    register_module("lm_head", full.get_submodule("lm_head"));
  }
}

Tensor CausalLMStage::hidden(const Tensor& x) {
  nn::Module& model = *get_submodule("model");
  Tensor h = x;
  if (first_) {
    DTR_CHECK(x.dim() == 2 && (x.dtype() == DType::i64 || x.dtype() == DType::i32), type_name(),
              " stage: expected input_ids [B, T] int64/int32, got ", x.sizes(), " ", x.dtype());
    h = model.get_submodule("embed_tokens")->call(x);
    if (const double s = embedding_scale(config_); s > 0) h = mul(h, s);
  }
  for (const auto& layer : model.get_submodule("layers")->children()) h = layer->call(h);
  return last_ ? model.get_submodule("norm")->call(h) : h;
}

Tensor CausalLMStage::forward(const Tensor& x) {
  Tensor h = hidden(x);
  return last_ ? softcap_logits(config_, get_submodule("lm_head")->call(h)) : h;
}

std::vector<Tensor> CausalLMStage::forward_list(const std::vector<Tensor>& inputs) {
  if (inputs.size() == 1) return {forward(inputs[0])};
  DTR_CHECK(inputs.size() == 2, type_name(), " stage: expected {x} or {x, targets}, got ", inputs.size(), " inputs");
  DTR_CHECK(last_, type_name(), " stage (layers ", begin_, "..", end_ - 1, "): targets go to the last stage only");
  const Tensor& x = inputs[0];
  const Tensor& targets = inputs[1];
  // (Under sequence parallelism the input holds this rank's T / tp positions; the targets all T.)
  DTR_CHECK(targets.dim() == 2 && x.dim() >= 2 && targets.size(0) == x.size(0), type_name(),
            " stage: targets must be [B, T] with the input's B (input ", x.sizes(), "), got ", targets.sizes());
  DTR_CHECK(targets.dtype() == DType::i64, type_name(), " stage: targets must be int64, got ", targets.dtype());
  return {lm_head_loss(config_, *get_submodule("lm_head"), hidden(x), targets)};
}

std::vector<std::shared_ptr<CausalLMStage>> make_pipeline_stages(CausalLM& full, int pp, int pp_rank, int v,
                                                                 const std::vector<int64_t>& counts,
                                                                 const std::string& where) {
  const int S = pp * v;
  const auto ranges = stage_layer_ranges(split_layers(full.config().num_hidden_layers, S, counts, where));
  std::vector<std::shared_ptr<CausalLMStage>> out;
  for (int s = pp_rank; s < S; s += pp)
    out.push_back(std::make_shared<CausalLMStage>(full, ranges[s].first, ranges[s].second, s == 0, s == S - 1));
  return out;
}

Tensor tied_stage_weight(CausalLMStage& stage) {
  if (!stage.config().tie_word_embeddings) return Tensor();
  if (stage.is_first()) return stage.get_parameter("model.embed_tokens.weight");
  if (stage.is_last()) return stage.get_parameter("lm_head.weight");
  return Tensor();
}

}  // namespace dtr
