// Copy-in / copy-out ops of collectives (FSDP's flat reduce-scatter and all-gather buffers):
// chunk_cat and split_with_sizes_copy, with CPU and CUDA kernels (bodies shared in
// ops/collective_copy_kernel.h). Not differentiable: collectives run them under NoGradGuard.
// Source: PyTorch torch._chunk_cat and torch.split_with_sizes_copy (FSDP2's
// _fsdp_collectives.py uses them for foreach_reduce and foreach_all_gather_copy_out).
#include "tensor/ops/collective_copy.h"

#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/shape.h"

namespace dtr {

Tensor chunk_cat(const std::vector<Tensor>& xs, int64_t num_chunks) {
  DTR_CHECK(!xs.empty(), "chunk_cat: expected a non-empty list of tensors");
  DTR_CHECK(num_chunks >= 1, "chunk_cat: num_chunks=", num_chunks, " must be >= 1");
  DTR_CHECK(!needs_grad(xs), "chunk_cat: not differentiable (call it under NoGradGuard)");
  std::vector<Tensor> in;
  in.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& t = xs[i];
    DTR_CHECK(t.defined() && !t.is_distributed(), "chunk_cat: tensor ", i, " must be a defined local tensor");
    DTR_CHECK(t.dim() >= 1, "chunk_cat: tensor ", i, " is zero-dimensional (dim 0 is split into chunks)");
    DTR_CHECK(t.dtype() == xs[0].dtype() && t.device() == xs[0].device(), "chunk_cat: tensor ", i, " is ", t.dtype(),
              " on ", t.device(), ", expected ", xs[0].dtype(), " on ", xs[0].device());
    in.push_back(contiguous(t));
  }
  static const OpDef* op = op_def("chunk_cat");
  return dispatch1(OpCall{op, std::move(in), {num_chunks}});
}

void split_with_sizes_copy(const Tensor& src, const Shape& sizes, int64_t dim, const std::vector<Tensor>& outs) {
  DTR_CHECK(src.defined() && !src.is_distributed(), "split_with_sizes_copy: src must be a defined local tensor");
  const int64_t d = wrap_dim(dim, src.dim(), "split_with_sizes_copy");
  DTR_CHECK(sizes.size() == outs.size(), "split_with_sizes_copy: ", sizes.size(), " split sizes for ", outs.size(),
            " outputs");
  int64_t total = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    Shape want = src.sizes();
    want[d] = sizes[j];
    const Tensor& o = outs[j];
    DTR_CHECK(o.defined() && !o.is_distributed() && o.sizes() == want && o.dtype() == src.dtype() &&
                  o.device() == src.device(),
              "split_with_sizes_copy: output ", j, " must be a local ", src.dtype(), " tensor ", want, " on ",
              src.device(), ", got ", o.defined() ? o.sizes() : Shape{}, " ", o.dtype(), " on ", o.device());
    check_inplace(o, "split_with_sizes_copy");
    total += sizes[j];
  }
  DTR_CHECK(total == src.sizes()[d], "split_with_sizes_copy: split sizes sum to ", total, " but dim ", d, " of ",
            src.sizes(), " is ", src.sizes()[d]);
  std::vector<Tensor> in{src};
  in.insert(in.end(), outs.begin(), outs.end());
  static const OpDef* op = op_def("split_with_sizes_copy");
  dispatch(OpCall{op, std::move(in), {sizes, d}});
  for (const Tensor& o : outs) o.bump_version();
}

}  // namespace dtr
