#pragma once
// Helpers of the runtime tests: per-rank inputs as pure functions of (rank, index), dtype-aware
// comparison against references computed locally in f64.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include "tensor/ops.h"

namespace dtr::testing {

/// The dtypes every collective is tested with.
inline const std::vector<DType> kCommDTypes = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i64, DType::i32};

/// Element i of rank r for sum / avg / max / min: an integer in [-5, 5], exact in every dtype
/// (sums over <= 6 ranks stay within bf16's exact integers).
inline double value(int r, int64_t i) { return static_cast<double>((i * 7 + r * 5) % 11) - 5.0; }
/// Element i of rank r for product: 1 or 2 (products over <= 6 ranks <= 64, exact in bf16).
inline double pvalue(int r, int64_t i) { return 1.0 + static_cast<double>((i + r) % 2); }

/// A tensor of `shape` and dtype `dt` with element i = f(i).
inline Tensor make(const Shape& shape, DType dt, const std::function<double(int64_t)>& f) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = f(i);
  return from_vector<double>(v, shape).to(dt);
}

/// Relative tolerance of a dtype for results that are not exact integers (AVG): one rounding
/// of the f32-accumulated result to the dtype (bf16 8 bits, f16 11 bits, f32 24 bits).
inline double rel_tol(DType dt) {
  switch (dt) {
    case DType::bf16: return 1.0 / 256;
    case DType::f16: return 1.0 / 2048;
    case DType::f32: return 1e-6;
    default: return 1e-12;
  }
}

/// Number of elements of `t` that differ from ref(i) beyond the dtype tolerance.
inline int64_t mismatches(const Tensor& t, const std::function<double(int64_t)>& ref) {
  const Tensor c = t.contiguous().to(DType::f64).contiguous();
  const double* v = static_cast<const double*>(c.data_ptr());
  const double tol = rel_tol(t.dtype());
  const size_t n = static_cast<size_t>(c.numel());
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = ref(static_cast<int64_t>(i));
    if (std::abs(v[i] - r) > tol * std::abs(r)) ++bad;
  }
  return bad;
}

}  // namespace dtr::testing
