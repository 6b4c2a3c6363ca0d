// cat / split / split_with_sizes / chunk with torch semantics. split and chunk return views
// (narrow); cat copies and its backward narrows the gradient.
#include "tensor/autograd/node.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"

namespace dtr {
namespace {
/// torch.cat skips 1-D empty tensors (legacy behaviour) when other inputs have more dims.
bool skipped_in_cat(const Tensor& t) { return t.dim() == 1 && t.sizes()[0] == 0; }
}  // namespace

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  DTR_CHECK(!xs.empty(), "cat: expected a non-empty list of tensors");
  const Tensor* ref = nullptr;
  for (const Tensor& t : xs) {
    DTR_CHECK(t.defined(), "cat: undefined tensor in the list");
    if (!ref && !skipped_in_cat(t)) ref = &t;
  }
  if (!ref) ref = &xs[0];
  DTR_CHECK(ref->dim() > 0, "cat: zero-dimensional tensors cannot be concatenated");
  const int64_t d = wrap_dim(dim, ref->dim(), "cat");
  std::vector<Tensor> in;
  Shape sizes;  // size along d of each kept input
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& t = xs[i];
    if (&t != ref && skipped_in_cat(t) && ref->dim() != 1) continue;
    DTR_CHECK(t.dtype() == ref->dtype(), "cat: dtype mismatch: tensor ", i, " is ", t.dtype(), ", expected ",
              ref->dtype());
    bool ok = t.dim() == ref->dim();
    for (int64_t k = 0; ok && k < t.dim(); ++k) ok = k == d || t.sizes()[k] == ref->sizes()[k];
    DTR_CHECK(ok, "cat: sizes must match except in dim ", d, ": tensor ", i, " has shape ", t.sizes(),
              ", expected like ", ref->sizes());
    in.push_back(t);
    sizes.push_back(t.sizes()[d]);
  }
  static const OpDef* op = op_def("cat");
  Tensor out = dispatch1(OpCall{op, in, {d}});
  if (needs_grad(in)) {
    record("cat", in, out, [d, sizes](const std::vector<Tensor>& g, const std::vector<bool>& n) {
      std::vector<Tensor> r(sizes.size());
      int64_t off = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (n[i]) r[i] = narrow(g[0], d, off, sizes[i]);
        off += sizes[i];
      }
      return r;
    });
  }
  return out;
}

std::vector<Tensor> split_with_sizes(const Tensor& x, const Shape& sizes, int64_t dim) {
  DTR_CHECK(x.dim() > 0, "split_with_sizes: cannot split a zero-dimensional tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    DTR_CHECK(s >= 0, "split_with_sizes: negative size ", s, " in ", sizes);
    total += s;
  }
  DTR_CHECK(total == x.sizes()[d], "split_with_sizes: sizes ", sizes, " sum to ", total, " but dim ", d,
            " of shape ", x.sizes(), " has size ", x.sizes()[d]);
  std::vector<Tensor> out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, d, off, s));
    off += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  DTR_CHECK(x.dim() > 0, "split: cannot split a zero-dimensional tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.sizes()[d];
  DTR_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive, got ", split_size,
            " for dim ", d, " of size ", n);
  const int64_t num = split_size == 0 ? 1 : std::max<int64_t>((n + split_size - 1) / split_size, 1);
  Shape sizes(num, split_size);
  sizes.back() = n - split_size * (num - 1);
  return split_with_sizes(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  DTR_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  DTR_CHECK(x.dim() > 0, "chunk: cannot chunk a zero-dimensional tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.sizes()[d];
  const int64_t size = (n + chunks - 1) / chunks;
  if (n == 0) return split_with_sizes(x, Shape(chunks, 0), d);  // torch: `chunks` empty tensors
  return split(x, size, d);
}

}  // namespace dtr
