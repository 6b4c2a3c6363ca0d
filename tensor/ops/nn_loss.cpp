// cross_entropy(logits [N, C], targets [N]): fused log-softmax + negative log-likelihood,
// mean over the tokens whose target != ignore_index (0 when every token is ignored).
// Backward ("cross_entropy_backward"): (softmax(logits) - onehot(target)) * g / count on
// non-ignored rows, 0 on ignored rows. Source: torch.nn.functional.cross_entropy (mean).
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  DTR_CHECK(logits.dim() == 2 && is_floating(logits.dtype()), "cross_entropy: logits must be floating [N, C], got ",
            logits.dtype(), " ", logits.sizes());
  DTR_CHECK(targets.dim() == 1 && targets.sizes()[0] == logits.sizes()[0],
            "cross_entropy: targets must be [N] with N = ", logits.sizes()[0], ", got ", targets.sizes());
  DTR_CHECK(targets.dtype() == DType::i64 || targets.dtype() == DType::i32,
            "cross_entropy: targets must be int64 (or int32), got ", targets.dtype());
  static const OpDef* op = op_def("cross_entropy");
  Tensor out = dispatch1(OpCall{op, {logits, targets}, {ignore_index}});
  if (needs_grad({logits})) {
    record("cross_entropy", {logits, targets}, out,
           [sl = SavedTensor(logits), st = SavedTensor(targets), ignore_index](const std::vector<Tensor>& g,
                                                                                const std::vector<bool>&) {
             static const OpDef* bw = op_def("cross_entropy_backward");
             const char* nm = "cross_entropy";
             return std::vector<Tensor>{dispatch1(OpCall{bw, {g[0], sl.get(nm), st.get(nm)}, {ignore_index}}),
                                        Tensor()};
           });
  }
  return out;
}

}  // namespace dtr
