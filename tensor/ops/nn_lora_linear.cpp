// lora_linear(x, W, b, A, B, scale, xa): y = x W^T + b + scale * (xa A^T) B^T, the LoRA linear
// (Hu et al. 2021) as one autograd node whose adapter term is added into the base GEMM's output
// by the GEMM itself (addmm_: the SGEMM's accumulate form, beta 1 / cuBLASLt beta 1), where the
// composed form (linear + linear + linear + add) writes a second [tokens, out] result and then
// reads both for the add. The backward does the same for the input gradient:
//   gh = scale * dY B                         [T, r]
//   dX = dY W, then += gh A in place (addmm_)  (xa = x: one [T, in] result, no add)
//   dA = gh^T xa, dB = dY^T h with h = scale * xa A^T (saved from the forward, [T, r])
// xa is the adapter's input when it differs from x (LoRA dropout on the input: its gradient
// gh A goes to xa's own node). Local tensors only (LoRALinear keeps its composed form for
// DTensors and hooked adapters); the ops are mm / addmm_ / add / sum, so any device that has
// them runs it.
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace dtr {

Tensor lora_linear(const Tensor& input, const Tensor& weight, const Tensor& bias, const Tensor& lora_a,
                   const Tensor& lora_b, double scale, const Tensor& lora_input) {
  DTR_CHECK(weight.dim() == 2 && input.dim() >= 1 && input.size(-1) == weight.size(1), "lora_linear: input ",
            input.sizes(), " does not match weight ", weight.sizes(), " (expected input [..., ", weight.size(1), "])");
  const int64_t in = weight.size(1), out = weight.size(0);
  DTR_CHECK(lora_a.dim() == 2 && lora_a.size(1) == in && lora_b.dim() == 2 && lora_b.size(0) == out &&
                lora_b.size(1) == lora_a.size(0),
            "lora_linear: lora_A ", lora_a.sizes(), " / lora_B ", lora_b.sizes(), " do not match weight ",
            weight.sizes(), " (expected [r, ", in, "] and [", out, ", r])");
  DTR_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out), "lora_linear: bias ", bias.sizes(),
            " does not match weight ", weight.sizes());
  DTR_CHECK(!lora_input.defined() || lora_input.sizes() == input.sizes(), "lora_linear: lora_input ",
            lora_input.sizes(), " differs from the input ", input.sizes());
  for (const Tensor* t : {&input, &weight, &bias, &lora_a, &lora_b, &lora_input}) {
    if (!t->defined()) continue;
    DTR_CHECK(!t->is_distributed(), "lora_linear: local tensors only (got a DTensor; LoRALinear composes linear + "
                                    "add for those)");
    DTR_CHECK(t->dtype() == weight.dtype() && t->device() == weight.device(), "lora_linear: operands must share the "
              "weight's dtype and device (", weight.dtype(), "), got ", t->dtype());
  }
  const bool separate = lora_input.defined();
  Shape out_shape = input.sizes();
  out_shape.back() = out;
  Tensor x2, xa2, h, y;
  {
    NoGradGuard ng;
    auto rows = [in](const Tensor& t) { return t.dim() == 2 ? t.detach() : reshape(t.detach(), {-1, in}); };
    x2 = rows(input);
    xa2 = separate ? rows(lora_input) : x2;
    y = mm(x2, weight.detach().t());
    if (bias.defined()) y = add(y, bias.detach());
    h = mul(mm(xa2, lora_a.detach().t()), scale);  // [T, r]: scale between A and B
    addmm_(y, h, lora_b.detach().t());
    if (input.dim() != 2) y = reshape(y, out_shape);
  }
  const std::vector<Tensor> inputs{input, weight, bias, lora_a, lora_b, lora_input};
  if (!needs_grad(inputs)) return y;
  const bool want_w = weight.requires_grad();
  record("lora_linear", inputs, y,
         [sx = SavedTensor(want_w || !separate ? x2 : Tensor()), sxa = SavedTensor(separate ? xa2 : Tensor()),
          sh = SavedTensor(h), sw = SavedTensor(weight.detach()), sa = SavedTensor(lora_a.detach()),
          sb = SavedTensor(lora_b.detach()), xs = input.sizes(), out, scale,
          separate](const std::vector<Tensor>& g, const std::vector<bool>& n) {
           const char* nm = "lora_linear";
           const Tensor dy = g[0].dim() == 2 ? g[0] : reshape(g[0], {-1, out});
           auto shaped = [&](const Tensor& t) { return xs.size() == 2 ? t : reshape(t, xs); };
           std::vector<Tensor> r(6);
           const bool want_gh = n[3] || (n[0] && !separate) || n[5];
           const Tensor gh = want_gh ? mul(mm(dy, sb.get(nm)), scale) : Tensor();  // [T, r]
           if (n[0]) {
             Tensor dx = mm(dy, sw.get(nm));
             if (!separate) addmm_(dx, gh, sa.get(nm));  // dY W + gh A, accumulated by the GEMM
             r[0] = shaped(dx);
           }
           if (n[1]) r[1] = mm(dy.t(), sx.get(nm));
           if (n[2]) r[2] = sum(dy, {0});
           if (n[3]) r[3] = mm(gh.t(), separate ? sxa.get(nm) : sx.get(nm));
           if (n[4]) r[4] = mm(dy.t(), sh.get(nm));
           if (n[5]) r[5] = shaped(mm(gh, sa.get(nm)));
           return r;
         });
  return y;
}

}  // namespace dtr
