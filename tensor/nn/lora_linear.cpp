// nn::LoRALinear (see lora_linear.h).
#include "tensor/nn/lora_linear.h"

#include <cmath>

#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr::nn {

LoraDropoutPosition lora_dropout_position_from_string(const std::string& s) {
  if (s == "pre") return LoraDropoutPosition::pre;
  if (s == "post") return LoraDropoutPosition::post;
  DTR_ERROR("LoRA: dropout_position must be \"pre\" or \"post\", got \"", s, "\"");
}

LoraInit lora_init_from_string(const std::string& s) {
  if (s == "kaiming" || s == "kaiming_uniform") return LoraInit::kaiming;
  if (s == "xavier" || s == "xavier_normal") return LoraInit::xavier;
  DTR_ERROR("LoRA: init must be \"kaiming\" or \"xavier\", got \"", s, "\"");
}

const char* to_string(LoraDropoutPosition p) { return p == LoraDropoutPosition::pre ? "pre" : "post"; }
const char* to_string(LoraInit i) { return i == LoraInit::kaiming ? "kaiming" : "xavier"; }

double lora_scale(const LoraOptions& o) {
  DTR_CHECK(o.r > 0, "LoRA: rank r must be positive, got ", o.r);
  return o.use_rslora ? o.alpha / std::sqrt(static_cast<double>(o.r)) : o.alpha / static_cast<double>(o.r);
}

LoRALinear::LoRALinear(const std::shared_ptr<Linear>& base, const LoraOptions& opts)
    : in_features(base ? base->in_features : 0), out_features(base ? base->out_features : 0), opts_(opts) {
  DTR_CHECK(base != nullptr, "LoRALinear: base Linear is null");
  DTR_CHECK(opts.r > 0, "LoRALinear: rank r must be positive, got ", opts.r, " (in ", in_features, ", out ",
            out_features, ")");
  DTR_CHECK(opts.dropout >= 0.0 && opts.dropout < 1.0, "LoRALinear: dropout must be in [0, 1), got ", opts.dropout);
  scale_ = lora_scale(opts);
  const Tensor w = base->weight();
  const DType dt = w.dtype();
  // The base stays under its own names and is frozen (NeMo LinearLoRA: weight.requires_grad = False).
  register_parameter("weight", w, false);
  if (base->bias().defined()) register_parameter("bias", base->bias(), false);

  // lora_A [r, in]: nn::Linear's default init is already Kaiming-uniform with a = sqrt(5),
  // i.e. U(-1/sqrt(in), 1/sqrt(in)) (torch.nn.init.kaiming_uniform_(a=math.sqrt(5))).
  auto a = std::make_shared<Linear>(in_features, opts.r, false, dt, /*init=*/opts.init == LoraInit::kaiming);
  if (opts.init == LoraInit::xavier) {
    // torch.nn.init.xavier_normal_: std = sqrt(2 / (fan_in + fan_out)).
    const double std = std::sqrt(2.0 / static_cast<double>(in_features + opts.r));
    a->register_parameter("weight", normal({opts.r, in_features}, 0.0, std, TensorOptions(dt)));
  }
  auto b = std::make_shared<Linear>(opts.r, out_features, false, dt, /*init=*/false);  // zeros
  register_module("lora_A", a);
  register_module("lora_B", b);
}

std::shared_ptr<Linear> LoRALinear::lora_A() const {
  auto m = std::dynamic_pointer_cast<Linear>(const_cast<LoRALinear*>(this)->get_submodule("lora_A"));
  DTR_CHECK(m != nullptr, "LoRALinear: lora_A is not a Linear");
  return m;
}

std::shared_ptr<Linear> LoRALinear::lora_B() const {
  auto m = std::dynamic_pointer_cast<Linear>(const_cast<LoRALinear*>(this)->get_submodule("lora_B"));
  DTR_CHECK(m != nullptr, "LoRALinear: lora_B is not a Linear");
  return m;
}

Tensor LoRALinear::forward(const Tensor& x) {
  if (merged_) return linear(x, weight(), bias());
  const bool drop = is_training() && opts_.dropout > 0.0;
  const bool post = drop && opts_.dropout_position == LoraDropoutPosition::post;
  const auto a = get_submodule("lora_A"), b = get_submodule("lora_B");
  const Tensor w = weight(), bs = bias();
  if (!post && fusable(*a, *b, x)) {
    // One node: the adapter term accumulated into the base GEMM's output (ops/nn_lora_linear.cpp).
    const Tensor xa = drop ? dropout(x, opts_.dropout, true) : Tensor();
    return lora_linear(x, w, bs, a->parameter("weight"), b->parameter("weight"), scale_, xa);
  }
  Tensor y = linear(x, w, bs);
  Tensor h = drop && !post ? dropout(x, opts_.dropout, true) : x;
  // Scale between A and B: keeps the rowwise-parallel branch Partial until the single reduction.
  h = mul(a->call(h), scale_);
  h = b->call(h);
  if (post) h = dropout(h, opts_.dropout, true);
  return add(y, h);
}

bool LoRALinear::fusable(const Module& a, const Module& b, const Tensor& x) const {
  // lora_linear needs local tensors of one dtype (f32 / f64: the accumulate GEMM's dtypes on
  // every device) and adapters that are plain bias-free Linears without hooks (tensor-parallel
  // styles and user hooks act through Module::call).
  if (a.type_name() != "Linear" || b.type_name() != "Linear" || a.has_forward_hooks() || b.has_forward_hooks() ||
      a.has_parameter("bias") || b.has_parameter("bias"))
    return false;
  const Tensor w = weight(), bs = bias();
  if (w.dtype() != DType::f32 && w.dtype() != DType::f64) return false;
  for (const Tensor& t : {x, w, bs, a.parameter("weight"), b.parameter("weight")})
    if (t.defined() && (t.is_distributed() || t.dtype() != w.dtype() || t.device() != w.device())) return false;
  return true;
}

Tensor LoRALinear::delta_weight() const {
  const Tensor w = weight();
  Tensor d = mul(mm(lora_B()->weight(), lora_A()->weight()), scale_);
  return d.dtype() == w.dtype() ? d : to_dtype(d, w.dtype());
}

void LoRALinear::merge() {
  DTR_CHECK(!merged_, "LoRALinear.merge: already merged (out ", out_features, ", in ", in_features, ")");
  NoGradGuard ng;
  Tensor w = weight();
  add_(w, delta_weight(), 1.0);
  merged_ = true;
}

void LoRALinear::unmerge() {
  DTR_CHECK(merged_, "LoRALinear.unmerge: not merged (out ", out_features, ", in ", in_features, ")");
  NoGradGuard ng;
  Tensor w = weight();
  add_(w, delta_weight(), -1.0);
  merged_ = false;
}

Tensor LoRALinear::merged_weight() const {
  NoGradGuard ng;
  if (merged_) return weight().detach();
  return add(weight().detach(), delta_weight());
}

}  // namespace dtr::nn
