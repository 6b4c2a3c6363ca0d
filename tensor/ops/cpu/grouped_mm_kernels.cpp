// CPU kernel of grouped_mm (see ops/grouped_mm.cpp): one cpu::gemm (dtr's SGEMM for f32, Eigen
// for f64) per group on strided views, no copies for transposed operands. Groups with few
// FLOPs, or groups none of which exceeds a thread's share of the work, run one per thread
// (OpenMP over groups, each GEMM single-threaded inside the region); otherwise they run in turn,
// each GEMM parallel inside. Groups of size 0 give zero rows (2x3) or
// a zero [K, N] block (2x2). Results do not depend on the thread count (each GEMM's do not).
#include <omp.h>

#include <algorithm>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/gemm.h"
#include "tensor/ops/cpu/loops.h"

namespace dtr {
namespace {

/// FLOPs below which a group's GEMM runs single-threaded beside the others (as bmm's batch split).
constexpr int64_t kSmallGroupWork = 1 << 21;

/// True when the GEMM can read the last two dims of t in place (one unit stride).
bool gemm_ok(const Tensor& t) {
  const int64_t d = t.dim();
  const int64_t r = t.sizes()[d - 2], c = t.sizes()[d - 1];
  return t.strides()[d - 1] == 1 || c == 1 || t.strides()[d - 2] == 1 || r == 1;
}
Tensor operand(const Tensor& t) { return gemm_ok(t) ? t : t.contiguous(); }

/// Runs one(g) for every group: in parallel over groups (each GEMM single-threaded) when each is
/// small, or when no group is larger than a thread's share of the total (balanced routing: one
/// parallel region for all experts instead of one per GEMM); else in turn, each GEMM parallel.
template <class F>
void for_groups(int64_t G, int64_t max_work, int64_t total_work, F one) {
  const int64_t threads = omp_get_max_threads();
  if (G > 1 && (max_work < kSmallGroupWork || (G >= 2 * threads && max_work * threads <= total_work))) {
#pragma omp parallel for schedule(dynamic)
    for (int64_t g = 0; g < G; ++g) one(g);
  } else {
    for (int64_t g = 0; g < G; ++g) one(g);
  }
}

std::vector<Tensor> k_grouped_mm(const OpCall& c) {
  const Tensor a = operand(c.inputs[0]), b = operand(c.inputs[1]);
  const Shape& sizes = c.shape(0);
  const int64_t G = static_cast<int64_t>(sizes.size());
  Shape offs(G + 1, 0);
  int64_t max_rows = 0;
  for (int64_t g = 0; g < G; ++g) {
    offs[g + 1] = offs[g] + sizes[g];
    max_rows = std::max(max_rows, sizes[g]);
  }
  const int64_t total_rows = offs[G];
  const bool three = b.dim() == 3;  // a [T, K] x b [G, K, N] -> [T, N]; else a [K, T] x b [T, N] -> [G, K, N]
  const int64_t K = three ? a.size(1) : a.size(0), N = three ? b.size(2) : b.size(1);
  Tensor out = empty(three ? Shape{a.size(0), N} : Shape{G, K, N}, TensorOptions(a.dtype()));
  cpu::dispatch_floating(a.dtype(), "grouped_mm", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    for_groups(G, max_rows * N * K, total_rows * N * K, [&](int64_t g) {
      const int64_t n = sizes[g], o = offs[g];
      if (three) {
        if (n > 0)
          cpu::gemm<T>(n, N, K, pa + o * a.stride(0), a.stride(0), a.stride(1), pb + g * b.stride(0), b.stride(1),
                       b.stride(2), po + o * N, false);
      } else if (n == 0) {
        std::fill(po + g * K * N, po + (g + 1) * K * N, T(0));
      } else {
        cpu::gemm<T>(K, N, n, pa + o * a.stride(1), a.stride(0), a.stride(1), pb + o * b.stride(0), b.stride(0),
                     b.stride(1), po + g * K * N, false);
      }
    });
  });
  return {out};
}

DTR_REGISTER_KERNEL("grouped_mm", DeviceType::CPU, k_grouped_mm);

}  // namespace
}  // namespace dtr
