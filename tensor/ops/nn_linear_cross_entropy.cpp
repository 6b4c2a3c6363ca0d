// linear_cross_entropy(input [N, H], weight [V, H], targets [N]): cross_entropy(input @ weight^T,
// targets) without the [N, V] logits. The tokens are taken in chunks of `chunk_size` rows; per
// chunk the logits [n, V] are formed (mm: dtr's SGEMM). When a gradient is wanted, one pass over
// them (cross_entropy_loss_and_grad_: per row the online max and sum, the row's loss, then
// softmax - onehot written over the logits while the row is in cache) gives the chunk's loss sum
// and its dlogits, turned at once into dinput rows (dlogits @ weight) and a weight-gradient term
// (dlogits^T @ input, one GEMM accumulating in place: addmm_); the chunk's logits are then
// dropped. Without a gradient the loss is cross_entropy's. The backward only scales the saved
// dinput / dweight by the upstream gradient (in place), so forward + backward cost the three
// GEMMs of the unfused head (no recompute) and hold O(chunk x V) logits instead of O(N x V).
// Gradients are formed in the forward only when grad mode is on and an operand requires grad
// (LoRA's frozen head: no dweight GEMM at all).
//
// Everything is a tensor op, so DTensor operands take the ops' own sharding rules: the
// loss-parallel head (weight Shard(0) over the vocabulary, input Replicate) gives logits
// Shard(1), which take cross_entropy + cross_entropy_backward (the one-pass kernel is for local
// tensors, and for devices that have it: CPU); those never gather the logits (row max
// all_reduce MAX, sum of exp and the target logit all_reduce SUM, dtensor/rules/loss.cpp),
// dinput Partial (summed over the vocabulary shards where it is used) and dweight Shard(0).
// Sources: Liger kernel's LigerFusedLinearCrossEntropyFunction (gradient in the forward,
// chunked over tokens, the loss and the gradient from one pass over the logits); Wijmans et
// al., "Cut Your Losses in Large-Vocabulary Language Models" (2024) for the memory argument.
#include <algorithm>

#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

/// Rows per chunk when none is given: the chunk's f32 logits take about 256 MiB (256 rows of
/// the 262,144 Gemma 3 vocabulary, 1365 of SmolLM2's 49,152), at least 16 rows. Fewer chunks
/// mean fewer passes of the in-place dweight update over [V, H].
int64_t auto_chunk(int64_t V) {
  constexpr int64_t kBudget = int64_t{1} << 28;  // bytes of one chunk's f32 logits
  return std::max<int64_t>(16, kBudget / (4 * std::max<int64_t>(V, 1)));
}

/// Non-ignored targets of `t` as a 0-d f64 tensor (a DTensor for DTensor targets).
Tensor counted(const Tensor& t, int64_t ignore) {
  return sum(rsub(to_dtype(eq(t, full_like(t, static_cast<double>(ignore))), DType::f64), 1.0));
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& input, const Tensor& weight, const Tensor& targets, int64_t ignore_index,
                            int64_t chunk_size) {
  DTR_CHECK(input.dim() == 2 && is_floating(input.dtype()),
            "linear_cross_entropy: input must be floating [N, H], got ", input.dtype(), " ", input.sizes());
  DTR_CHECK(weight.dim() == 2 && weight.size(1) == input.size(1), "linear_cross_entropy: weight must be [V, H] with H = ",
            input.size(1), ", got ", weight.sizes());
  DTR_CHECK(weight.dtype() == input.dtype(), "linear_cross_entropy: weight dtype ", weight.dtype(),
            " differs from the input's ", input.dtype());
  DTR_CHECK(targets.dim() == 1 && targets.size(0) == input.size(0), "linear_cross_entropy: targets must be [N] with N = ",
            input.size(0), ", got ", targets.sizes());
  DTR_CHECK(targets.dtype() == DType::i64 || targets.dtype() == DType::i32,
            "linear_cross_entropy: targets must be int64 (or int32), got ", targets.dtype());
  DTR_CHECK(chunk_size >= 0, "linear_cross_entropy: chunk_size must be >= 0 (0 = automatic), got ", chunk_size);
  const int64_t N = input.size(0), V = weight.size(0);
  const int64_t chunk = chunk_size > 0 ? chunk_size : auto_chunk(V);
  const bool want_dx = needs_grad({input}), want_dw = needs_grad({weight});
  // f32 arithmetic for bf16 / f16 operands (the logits, their statistics, the gradients).
  const DType cd = is_low_precision(input.dtype()) ? DType::f32 : input.dtype();
  Tensor dx, dw, loss;
  {
    NoGradGuard ng;
    // (to_dtype always copies: cast only what is low precision.)
    auto as_cd = [cd](const Tensor& t) { return t.dtype() == cd ? t.detach() : to_dtype(t.detach(), cd); };
    const Tensor x = as_cd(input), w = as_cd(weight);
    const Tensor count = counted(targets, ignore_index);
    // 1 / count as the scale of every chunk's mean (count 0: every gradient below is 0).
    const Tensor denom = maximum(count, full_like(count, 1.0));
    Tensor total = zeros({}, TensorOptions(DType::f64).with_device(input.device()));
    std::vector<Tensor> dxs;
    static const OpDef* ce_bw = op_def("cross_entropy_backward");
    static const OpDef* ce_fused = op_def("cross_entropy_loss_and_grad_");
    for (int64_t s = 0; s < N; s += chunk) {
      const int64_t n = std::min(chunk, N - s);
      const Tensor xc = narrow(x, 0, s, n), tc = narrow(targets, 0, s, n);
      const Tensor logits = mm(xc, w.t());  // [n, V]; Shard(1) under loss parallel
      const Tensor nc = counted(tc, ignore_index);
      const bool grad = want_dx || want_dw;
      // The gradient's scale g / (the chunk's count): g = nc / count gives 1 / count.
      const Tensor g = grad ? to_dtype(div(nc, denom), cd) : Tensor();
      Tensor dlogits;
      if (grad && !logits.is_distributed() && ce_fused->kernels[static_cast<int>(logits.device().type)] != nullptr) {
        // One pass over the chunk's logits: the loss sum and dlogits written over the logits.
        std::vector<Tensor> r = dispatch(OpCall{ce_fused, {g, logits, tc}, {ignore_index}});
        total = add(total, r[0]);
        dlogits = r[1];
      } else {
        // cross_entropy is the chunk's mean over its counted rows: times their count is the sum.
        total = add(total, mul(to_dtype(cross_entropy(logits, tc, ignore_index), DType::f64), nc));
        if (!grad) continue;
        dlogits = dispatch1(OpCall{ce_bw, {g, logits, tc}, {ignore_index}});
      }
      if (want_dx) dxs.push_back(mm(dlogits, w));
      if (want_dw) {
        // dweight = sum over chunks of dlogits^T x_c, each term one GEMM over the whole
        // vocabulary: the first chunk's product is dweight; later ones are added in place by
        // the GEMM itself (addmm_, beta 1: no temporary, no second [V, H] buffer). A DTensor
        // dweight (Shard(0) under loss parallel, Partial with the rows sharded) adds its terms
        // out of place (addmm_ has no sharding rule).
        if (!dw.defined()) dw = mm(dlogits.t(), xc);
        else if (dw.is_distributed()) dw = add(dw, mm(dlogits.t(), xc));
        else addmm_(dw, dlogits.t(), xc);
      }
    }
    loss = to_dtype(div(total, denom), input.dtype());
    if (want_dx) dx = N == 0 ? zeros_like(x) : dxs.size() == 1 ? dxs[0] : cat(dxs, 0);
    if (want_dw && !dw.defined()) dw = zeros_like(w);  // N == 0
  }
  if (want_dx || want_dw) {
    // The backward hands the saved gradients on, scaled in place when local (no copy of the
    // [V, H] weight gradient); the graph is used once (no retain_graph).
    auto saved = std::make_shared<std::pair<Tensor, Tensor>>(dx, dw);
    dx = dw = Tensor();
    record("linear_cross_entropy", {input, weight, targets}, loss,
           [saved, xd = input.dtype()](const std::vector<Tensor>& g, const std::vector<bool>& n) {
             DTR_CHECK(saved->first.defined() || saved->second.defined(),
                       "linear_cross_entropy: backward ran twice (its saved gradients are handed on once)");
             auto scaled = [&](Tensor& d, bool need) {
               Tensor out;
               if (need && d.defined()) {
                 if (!d.is_distributed() && !g[0].is_distributed()) {
                   const double s = g[0].item<double>();
                   if (s != 1.0) mul_(d, s);
                   out = d.dtype() == xd ? d : to_dtype(d, xd);
                 } else {
                   out = to_dtype(mul(d, to_dtype(g[0], d.dtype())), xd);
                 }
               }
               d = Tensor();
               return out;
             };
             return std::vector<Tensor>{scaled(saved->first, n[0]), scaled(saved->second, n[1]), Tensor()};
           });
  }
  return loss;
}

}  // namespace dtr
