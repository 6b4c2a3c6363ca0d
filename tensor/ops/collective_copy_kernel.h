#pragma once
// The kernel bodies of chunk_cat and split_with_sizes_copy, shared by the CPU
// (ops/cpu/collective_copy_kernels.cpp) and CUDA (ops/cuda/collective_copy.cu) kernels: both
// are strided views of their operands handed to the backend's same-dtype strided copy, so the
// layouts are written once and the backends differ only in how they allocate, zero and copy.
// Front ends and argument checks: ops/collective_copy.cpp.
#include <algorithm>

#include "tensor/dispatch.h"

namespace dtr::collective_copy {

/// Row geometry of one chunk_cat input: dim 0 split into `num_chunks` chunks of `chunk_rows`
/// rows (torch.chunk sizes; the last ones short or empty), each padded to chunk_rows rows.
struct ChunkGeometry {
  int64_t rows = 0, row_numel = 1, chunk_rows = 0;
  int64_t chunk_numel() const { return chunk_rows * row_numel; }
};

inline ChunkGeometry chunk_geometry(const Tensor& t, int64_t num_chunks) {
  ChunkGeometry g;
  g.rows = t.sizes()[0];
  for (size_t d = 1; d < t.sizes().size(); ++d) g.row_numel *= t.sizes()[d];
  g.chunk_rows = (g.rows + num_chunks - 1) / num_chunks;
  return g;
}

/// out [num_chunks, sum_i chunk_numel_i]: row c holds chunk c of every input (flattened, zero
/// padded), inputs in order. Inputs are contiguous (the front end makes them so).
template <class Empty, class Zero, class Copy>
Tensor chunk_cat(const OpCall& c, Empty&& empty_like_device, Zero&& zero, Copy&& copy) {
  const int64_t nc = c.i(0);
  int64_t total = 0;
  bool padded = false;
  for (const Tensor& t : c.inputs) {
    const ChunkGeometry g = chunk_geometry(t, nc);
    total += g.chunk_numel();
    padded = padded || g.chunk_rows * nc != g.rows;
  }
  Tensor out = empty_like_device(Shape{nc, total}, c.inputs[0]);
  if (padded) zero(out);
  int64_t off = 0;
  for (const Tensor& t : c.inputs) {
    const ChunkGeometry g = chunk_geometry(t, nc);
    if (g.chunk_rows == 0) continue;
    const int64_t full = g.rows / g.chunk_rows, rest = g.rows - full * g.chunk_rows;
    const int64_t cn = g.chunk_numel(), base = t.storage_offset();
    if (full > 0)
      copy(make_view(out, {full, cn}, {total, 1}, off), make_view(t, {full, cn}, {cn, 1}, base));
    if (rest > 0)
      copy(make_view(out, {1, rest * g.row_numel}, {total, 1}, full * total + off),
           make_view(t, {1, rest * g.row_numel}, {rest * g.row_numel, 1}, base + full * cn));
    off += cn;
  }
  return out;
}

/// outs[j] <- narrow(src, dim, sum_{i<j} sizes[i], sizes[j]); src = inputs[0], outs = inputs[1..].
template <class Copy>
void split_with_sizes_copy(const OpCall& c, Copy&& copy) {
  const Tensor& src = c.inputs[0];
  const Shape& sizes = c.shape(0);
  const int64_t dim = c.i(1);
  int64_t off = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    Shape sz = src.sizes();
    sz[dim] = sizes[j];
    if (shape_numel(sz) > 0)
      copy(c.inputs[j + 1], make_view(src, sz, src.strides(), src.storage_offset() + off * src.strides()[dim]));
    off += sizes[j];
  }
}

}  // namespace dtr::collective_copy
