#pragma once
// OffsetCalc<N>: maps a row-major linear index over a shape to the element offsets of N
// operands with arbitrary (broadcast / zero / transposed) strides, after the host merged
// adjacent dims that are contiguous for every operand and dropped size-1 dims
// (make_offset_calc). Used by the CUDA kernels (tensor/ops/cuda); plain C++ when not compiled by
// nvcc, so tests check it on the host against brute-force indexing.
#include <array>
#include <cstdint>

#include "tensor/tensor.h"

#ifndef DTR_HOST_DEVICE
#if defined(__CUDACC__)
#define DTR_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DTR_HOST_DEVICE inline
#endif
#endif

namespace dtr::cuda_ops {

/// Most dims an operand may have after coalescing (merging contiguous dims, dropping size-1).
constexpr int kMaxDims = 10;

/// Linear row-major index over `sizes` -> element offsets of N operands. Passed to kernels
/// by value. `contiguous`: every operand is dense row-major over the same shape (offset == index).
template <int N>
struct OffsetCalc {
  int ndim = 0;
  bool contiguous = true;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  DTR_HOST_DEVICE void get(int64_t i, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = contiguous ? i : 0;
    if (contiguous) return;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t idx = i % sizes[d];
      i /= sizes[d];
      for (int k = 0; k < N; ++k) off[k] += idx * strides[k][d];
    }
  }
};

/// Builds the OffsetCalc of N operands over `shape` with per-operand strides (each of
/// shape.size() entries): size-1 dims dropped, adjacent dims merged when contiguous for all.
/// Errors (naming `op`): more than kMaxDims dims remain.
template <int N>
OffsetCalc<N> make_offset_calc(const Shape& shape, const std::array<Shape, N>& strides, const char* op) {
  OffsetCalc<N> oc;
  Shape sz;
  std::array<Shape, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!sz.empty()) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (st[k].back() != strides[k][d] * shape[d]) merge = false;
      if (merge) {
        sz.back() *= shape[d];
        for (int k = 0; k < N; ++k) st[k].back() = strides[k][d];
        continue;
      }
    }
    sz.push_back(shape[d]);
    for (int k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
  }
  DTR_CHECK(static_cast<int>(sz.size()) <= kMaxDims, op, ": tensor of shape ", shape, " has more than ", kMaxDims,
            " non-mergeable dims (CUDA kernels index at most ", kMaxDims, ")");
  oc.ndim = static_cast<int>(sz.size());
  bool contig = sz.size() <= 1;
  for (int k = 0; k < N && contig; ++k)
    if (!sz.empty() && st[k][0] != 1) contig = false;
  oc.contiguous = contig;
  for (int d = 0; d < oc.ndim; ++d) {
    oc.sizes[d] = sz[d];
    for (int k = 0; k < N; ++k) oc.strides[k][d] = st[k][d];
  }
  return oc;
}

}  // namespace dtr::cuda_ops
