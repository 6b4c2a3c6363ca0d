// CPU kernels of reductions: sum, amax, all, any over any dims; max / argmax along one dim.
// Strategy: move the reduced dims last (a permuted view), make it contiguous when needed and
// reduce rows of length R. Reducing a leading block of a contiguous tensor (bias gradients)
// takes a row-accumulation path that needs no copy; sum's long rows are summed in fixed blocks.
#include <algorithm>
#include <limits>
#include <vector>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/shape.h"

namespace dtr {
namespace {

/// Elements per block of a long row's sum (see k_sum).
constexpr int64_t kSumBlock = 16384;

/// x with kept dims first and reduced dims last, contiguous (copied when the view is not).
Tensor reduced_last(const Tensor& x, const Shape& dims, int64_t& rows, int64_t& R) {
  Tensor p = reduced_last_view(x, dims, rows, R);
  if (!p.is_contiguous()) {
    Tensor c = empty(p.sizes(), TensorOptions(x.dtype()));
    c.copy_(p.detach());
    p = c;
  }
  return p;
}

std::vector<Tensor> k_sum(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Shape dims = reduction_dims(c.shape(0), x.dim(), "sum");
  const bool keepdim = c.b(1);
  Tensor out = empty(reduced_shape(x.sizes(), dims, keepdim), TensorOptions(x.dtype()));
  cpu::dispatch_numeric(x.dtype(), "sum", [&](auto tag) {
    using T = decltype(tag);
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    T* po = static_cast<T*>(out.data_ptr());
    // Fast path: contiguous input reduced over a leading block of dims.
    bool prefix = x.is_contiguous() && !dims.empty();
    for (size_t i = 0; i < dims.size(); ++i) prefix = prefix && dims[i] == static_cast<int64_t>(i);
    if (prefix && static_cast<int64_t>(dims.size()) < x.dim()) {
      int64_t R = 1;
      for (int64_t d : dims) R *= x.sizes()[d];
      const int64_t cols = out.numel();
      const T* px = static_cast<const T*>(x.data_ptr());
#pragma omp parallel for schedule(static) if (x.numel() >= cpu::kParallelGrain)
      for (int64_t j = 0; j < cols; ++j) {
        Acc acc = 0;
        for (int64_t r = 0; r < R; ++r) acc += px[r * cols + j];
        po[j] = static_cast<T>(acc);
      }
      return;
    }
    int64_t rows, R;
    Tensor p = reduced_last(x, dims, rows, R);
    const T* px = static_cast<const T*>(p.data_ptr());
    if (R >= 2 * kSumBlock) {
      // Long rows (a loss or a norm over a whole tensor: one row): blocks of kSumBlock summed
      // vectorised, in parallel over all rows' blocks, then each row's block sums in order; the
      // blocks do not depend on the thread count, so neither does the result.
      const int64_t nb = (R + kSumBlock - 1) / kSumBlock;
      std::vector<Acc> part(static_cast<size_t>(rows * nb));
#pragma omp parallel for schedule(dynamic) if (x.numel() >= cpu::kParallelGrain)
      for (int64_t ib = 0; ib < rows * nb; ++ib) {
        const int64_t i = ib / nb, b0 = ib % nb * kSumBlock, b1 = std::min(R, b0 + kSumBlock);
        const T* row = px + i * R;
        Acc acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t r = b0; r < b1; ++r) acc += static_cast<Acc>(row[r]);
        part[ib] = acc;
      }
      for (int64_t i = 0; i < rows; ++i) {
        Acc acc = 0;
        for (int64_t b = 0; b < nb; ++b) acc += part[i * nb + b];
        po[i] = static_cast<T>(acc);
      }
      return;
    }
#pragma omp parallel for schedule(static) if (x.numel() >= cpu::kParallelGrain)
    for (int64_t i = 0; i < rows; ++i) {
      Acc acc = 0;
      const T* row = px + i * R;
      for (int64_t r = 0; r < R; ++r) acc += row[r];
      po[i] = static_cast<T>(acc);
    }
  });
  return {out};
}

std::vector<Tensor> k_amax(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Shape dims = reduction_dims(c.shape(0), x.dim(), "amax");
  for (int64_t d : dims) DTR_CHECK(x.sizes()[d] > 0, "amax: reducing dim ", d, " of size 0 in ", x.sizes());
  Tensor out = empty(reduced_shape(x.sizes(), dims, c.b(1)), TensorOptions(x.dtype()));
  cpu::dispatch_numeric(x.dtype(), "amax", [&](auto tag) {
    using T = decltype(tag);
    int64_t rows, R;
    Tensor p = reduced_last(x, dims, rows, R);
    const T* px = static_cast<const T*>(p.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (x.numel() >= cpu::kParallelGrain)
    for (int64_t i = 0; i < rows; ++i) {
      T m = px[i * R];
      for (int64_t r = 1; r < R; ++r) m = std::max(m, px[i * R + r]);
      po[i] = m;
    }
  });
  return {out};
}

/// all / any over `dims` of any dtype (nonzero = true) into a bool tensor; an empty reduction
/// gives true (all) / false (any), the identities of logical and / or.
template <bool kAny>
std::vector<Tensor> logical_reduce(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const Shape dims = reduction_dims(c.shape(0), x.dim(), c.name());
  Tensor out = empty(reduced_shape(x.sizes(), dims, c.b(1)), TensorOptions(DType::bool_));
  auto run = [&](auto tag) {
    using T = decltype(tag);
    int64_t rows, R;
    Tensor p = reduced_last(x, dims, rows, R);
    const T* px = static_cast<const T*>(p.data_ptr());
    bool* po = static_cast<bool*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (x.numel() >= cpu::kParallelGrain)
    for (int64_t i = 0; i < rows; ++i) {
      bool acc = !kAny;  // all: true until a zero; any: false until a nonzero
      for (int64_t r = 0; r < R; ++r)
        if ((px[i * R + r] != T(0)) == kAny) {
          acc = kAny;
          break;
        }
      po[i] = acc;
    }
  };
  if (x.dtype() == DType::u8 || x.dtype() == DType::bool_) run(uint8_t{});
  else cpu::dispatch_numeric(x.dtype(), c.name(), run);
  return {out};
}

/// max along one dim: values and the index of the first maximum.
std::vector<Tensor> k_max_dim(const OpCall& c) {
  const Tensor& x = c.inputs[0];
  const int64_t d = wrap_dim(c.i(0), x.dim(), "max");
  DTR_CHECK(x.dim() == 0 || x.sizes()[d] > 0, "max: reducing dim ", d, " of size 0 in ", x.sizes());
  const Shape shape = reduced_shape(x.sizes(), x.dim() ? Shape{d} : Shape{}, c.b(1));
  Tensor vals = empty(shape, TensorOptions(x.dtype()));
  Tensor idx = empty(shape, TensorOptions(DType::i64));
  cpu::dispatch_numeric(x.dtype(), "max", [&](auto tag) {
    using T = decltype(tag);
    int64_t rows, R;
    Tensor p = reduced_last(x, x.dim() ? Shape{d} : Shape{}, rows, R);
    const T* px = static_cast<const T*>(p.data_ptr());
    T* pv = static_cast<T*>(vals.data_ptr());
    int64_t* pi = static_cast<int64_t*>(idx.data_ptr());
    for (int64_t i = 0; i < rows; ++i) {
      int64_t best = 0;
      for (int64_t r = 1; r < R; ++r)
        if (px[i * R + r] > px[i * R + best]) best = r;
      pv[i] = px[i * R + best];
      pi[i] = best;
    }
  });
  return {vals, idx};
}

/// Scatters g (reduced shape, keepdim) into zeros of the input shape at `indices` along dim.
std::vector<Tensor> k_max_dim_backward(const OpCall& c) {
  const Tensor g = c.inputs[0].contiguous();
  const Tensor idx = c.inputs[1].contiguous();
  const Shape& in = c.shape(0);
  const int64_t d = c.i(1);
  Tensor out = zeros(in, TensorOptions(g.dtype()));
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= in[i];
  for (size_t i = d + 1; i < in.size(); ++i) inner *= in[i];
  const int64_t n = in.empty() ? 1 : in[d];
  cpu::dispatch_floating(g.dtype(), "max_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pg = static_cast<const T*>(g.data_ptr());
    const int64_t* pi = static_cast<const int64_t*>(idx.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) po[(o * n + pi[o * inner + j]) * inner + j] = pg[o * inner + j];
  });
  return {out};
}

DTR_REGISTER_KERNEL("sum", DeviceType::CPU, k_sum);
DTR_REGISTER_KERNEL("amax", DeviceType::CPU, k_amax);
DTR_REGISTER_KERNEL("max_dim", DeviceType::CPU, k_max_dim);
DTR_REGISTER_KERNEL("all", DeviceType::CPU, logical_reduce<false>);
DTR_REGISTER_KERNEL("any", DeviceType::CPU, logical_reduce<true>);
DTR_REGISTER_KERNEL("max_dim_backward", DeviceType::CPU, k_max_dim_backward);

}  // namespace
}  // namespace dtr
