// embedding(ids, weight): row gather; backward scatter-adds the gradient rows into a zero
// [num, dim] gradient (op "embedding_backward", ids saved; a distributed weight is passed as an
// optional third input that only informs the sharding rule). Source: torch.nn.functional.embedding.
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {

Tensor embedding(const Tensor& ids, const Tensor& weight) {
  DTR_CHECK(ids.dtype() == DType::i64 || ids.dtype() == DType::i32, "embedding: ids must be int64 or int32, got ",
            ids.dtype(), " of shape ", ids.sizes());
  DTR_CHECK(weight.dim() == 2, "embedding: weight must be [num, dim], got ", weight.sizes());
  DTR_CHECK(is_floating(weight.dtype()), "embedding: weight must be floating, got ", weight.dtype());
  static const OpDef* op = op_def("embedding");
  Tensor out = dispatch1(OpCall{op, {ids, weight}, {}});
  if (needs_grad({weight})) {
    record("embedding", {ids, weight}, out,
           [sid = SavedTensor(ids), num = weight.sizes()[0],
            wd = weight.is_distributed() ? weight.detach() : Tensor()](const std::vector<Tensor>& g,
                                                                       const std::vector<bool>& n) {
             // A distributed weight rides along (unused by the kernel) so the sharding rule sees
             // its placements: a vocab-sharded weight gets a vocab-sharded gradient.
             static const OpDef* bw = op_def("embedding_backward");
             return std::vector<Tensor>{Tensor(), dispatch1(OpCall{bw, {g[0], sid.get("embedding"), wd}, {num}})};
           });
  }
  return out;
}

}  // namespace dtr
