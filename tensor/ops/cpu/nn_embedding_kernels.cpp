// CPU kernels of embedding (row gather, strided weight) and embedding_backward (scatter-add;
// threads own disjoint column ranges so accumulation needs no atomics).
#include <algorithm>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"

namespace dtr {
namespace {

Tensor contig(const Tensor& t) { return t.is_contiguous() ? t : contiguous(t.detach()); }

/// ids as a contiguous int64 vector, each checked against [0, num).
std::vector<int64_t> checked_ids(const Tensor& ids, int64_t num, const char* op) {
  std::vector<int64_t> v = ids.to_vector<int64_t>();
  for (size_t i = 0; i < v.size(); ++i)
    DTR_CHECK(v[i] >= 0 && v[i] < num, op, ": id ", v[i], " at position ", i, " (flat index into ids of shape ",
              ids.sizes(), ") is out of range for vocab size ", num);
  return v;
}

std::vector<Tensor> k_embedding(const OpCall& c) {
  const Tensor& ids = c.inputs[0];
  const Tensor& w = c.inputs[1];
  const int64_t num = w.sizes()[0], dim = w.sizes()[1];
  const std::vector<int64_t> v = checked_ids(ids, num, "embedding");
  Shape shape = ids.sizes();
  shape.push_back(dim);
  Tensor out = empty(shape, TensorOptions(w.dtype()));
  cpu::dispatch_floating(w.dtype(), "embedding", [&](auto tag) {
    using T = decltype(tag);
    const T* pw = static_cast<const T*>(w.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const int64_t rs = w.strides()[0], cs = w.strides()[1], n = static_cast<int64_t>(v.size());
#pragma omp parallel for schedule(static) if (n * dim >= cpu::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      const T* row = pw + v[i] * rs;
      T* o = po + i * dim;
      if (cs == 1) std::copy(row, row + dim, o);
      else
        for (int64_t j = 0; j < dim; ++j) o[j] = row[j * cs];
    }
  });
  return {out};
}

/// inputs {g [..., dim], ids [...]}, attrs {num} -> zeros [num, dim] with g rows added at ids.
std::vector<Tensor> k_embedding_backward(const OpCall& c) {
  Tensor g = contig(c.inputs[0]);
  const Tensor& ids = c.inputs[1];
  const int64_t num = c.i(0);
  const int64_t dim = g.dim() > 0 ? g.sizes().back() : 1;
  DTR_CHECK(g.dim() == ids.dim() + 1 && g.numel() == ids.numel() * dim, "embedding_backward: gradient ", g.sizes(),
            " does not match ids ", ids.sizes());
  const std::vector<int64_t> v = checked_ids(ids, num, "embedding_backward");
  Tensor out = zeros({num, dim}, TensorOptions(g.dtype()));
  cpu::dispatch_floating(g.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const int64_t n = static_cast<int64_t>(v.size());
    constexpr int64_t kCols = 64;  // column block per task
    const int64_t nblk = (dim + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (n * dim >= cpu::kParallelGrain && nblk > 1)
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t j0 = b * kCols, j1 = std::min(dim, j0 + kCols);
      for (int64_t i = 0; i < n; ++i) {
        const T* gr = pg + i * dim;
        T* o = po + v[i] * dim;
        for (int64_t j = j0; j < j1; ++j) o[j] += gr[j];
      }
    }
  });
  return {out};
}

DTR_REGISTER_KERNEL("embedding", DeviceType::CPU, k_embedding);
DTR_REGISTER_KERNEL("embedding_backward", DeviceType::CPU, k_embedding_backward);

}  // namespace
}  // namespace dtr
