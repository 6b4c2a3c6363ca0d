// moe_permute / moe_unpermute (see moe_permute.h): the ops "moe_permute" {x, slot_position} and
// "moe_permute_backward" {g, slot_position} (attrs {k}), "moe_unpermute"
// {ys, slot_position, probs} and "moe_unpermute_backward" {g, ys, slot_position, probs} ->
// {dys, dprobs} have CPU (ops/cpu/moe_permute_kernels.cpp) and CUDA (ops/cuda/moe_permute.cu)
// kernels. The unweighted moe_unpermute is the pair moe_permute / moe_permute_backward run the
// other way round.
#include "tensor/ops/moe_permute.h"

#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

void check_index(const Tensor& t, int64_t n, const char* op, const char* name) {
  DTR_CHECK(t.dtype() == DType::i64 && t.dim() == 1 && t.size(0) == n, op, ": ", name, " ", t.sizes(), " ", t.dtype(),
            " (expected int64 [", n, "])");
}

/// fwd(t, slot_position; k) recorded as `name` with the backward bwd(g, slot_position; k):
/// moe_permute and the unweighted moe_unpermute are the same pair of kernels run either way round.
Tensor permutation(const char* name, const OpDef* fwd, const OpDef* bwd, const Tensor& t, const Tensor& slot_position,
                   int64_t k) {
  Tensor out = dispatch1(OpCall{fwd, {t, slot_position}, {k}});
  if (needs_grad({t}))
    record(name, {t}, out, [bwd, slot_position, k](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{dispatch1(OpCall{bwd, {g[0], slot_position}, {k}})};
    });
  return out;
}

}  // namespace

Tensor moe_permute(const Tensor& x, const Tensor& slot_position, int64_t k) {
  DTR_CHECK(x.dim() == 2 && k > 0, "moe_permute: x ", x.sizes(), " (expected [N, H]) and k=", k, " (> 0)");
  check_index(slot_position, x.size(0) * k, "moe_permute", "slot_position");
  static const OpDef* fwd = op_def("moe_permute");
  static const OpDef* bwd = op_def("moe_permute_backward");
  return permutation("moe_permute", fwd, bwd, x, slot_position, k);
}

Tensor moe_unpermute(const Tensor& ys, const Tensor& slot_position, const Tensor& probs) {
  DTR_CHECK(ys.dim() == 2 && probs.dim() == 2 && probs.size(1) > 0 && ys.size(0) == probs.numel(), "moe_unpermute: ys ",
            ys.sizes(), " and probs ", probs.sizes(), " (expected [N*k, H] and [N, k], k >= 1)");
  DTR_CHECK(ys.dtype() == probs.dtype() && is_floating(ys.dtype()), "moe_unpermute: ys ", ys.dtype(), " and probs ",
            probs.dtype(), " (expected the same floating dtype)");
  check_index(slot_position, ys.size(0), "moe_unpermute", "slot_position");
  static const OpDef* op = op_def("moe_unpermute");
  Tensor out = dispatch1(OpCall{op, {ys, slot_position, probs}, {}});
  if (needs_grad({ys, probs}))
    record("moe_unpermute", {ys, probs}, out,
           [sy = SavedTensor(ys), sp = SavedTensor(probs), slot_position](const std::vector<Tensor>& g,
                                                                          const std::vector<bool>& n) {
             static const OpDef* bw = op_def("moe_unpermute_backward");
             std::vector<Tensor> d =
                 dispatch(OpCall{bw, {g[0], sy.get("moe_unpermute"), slot_position, sp.get("moe_unpermute")}, {}});
             return std::vector<Tensor>{n[0] ? d[0] : Tensor(), n[1] ? d[1] : Tensor()};
           });
  return out;
}

Tensor moe_unpermute(const Tensor& ys, const Tensor& slot_position, int64_t k) {
  DTR_CHECK(ys.dim() == 2 && k > 0 && ys.size(0) % k == 0, "moe_unpermute: ys ", ys.sizes(), " and k=", k,
            " (expected [N*k, H], k > 0)");
  check_index(slot_position, ys.size(0), "moe_unpermute", "slot_position");
  static const OpDef* fwd = op_def("moe_permute_backward");
  static const OpDef* bwd = op_def("moe_permute");
  return permutation("moe_unpermute", fwd, bwd, ys, slot_position, k);
}

}  // namespace dtr
