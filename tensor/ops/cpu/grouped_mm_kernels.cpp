// CPU kernel of grouped_mm (see ops/grouped_mm.cpp): cpu::gemm (dtr's SGEMM for f32, Eigen for
// f64) on strided views, no copies for transposed operands. All groups run in one OpenMP region:
// the work is a sequence of output rows (2x3: the rows of each group, each costing K N; 2x2: the
// K rows of each group's [K, N] block, each costing n_g N), cut into pieces of about a quarter of
// a thread's share (whole groups where they are no larger; a group larger than that, skewed
// routing, is cut like a parallel GEMM's rows), each a single-threaded GEMM; the threads take the
// next piece, largest first, from a shared counter. A thread slowed by another process takes
// fewer pieces, and none waits for another's last large expert (a static split, one range per
// thread, waited at the join whenever one vCPU ran slower: ARCHITECTURE.md, grouped_mm).
// Cuts fall on multiples of 16 rows from a group's start and leave both sides >= 16 rows (a
// smaller group is never cut), so every piece takes the GEMM path its whole group would (SGEMM's
// small-m path is for m <= 8) and, as the f32 GEMM's per-element sums do not depend on how rows
// are split, f32 results are bitwise independent of the thread count. Below kGroupParallelWork (group_pieces.h)
// FLOPs the groups run in turn. Groups of size 0 give zero rows (2x3) or a zero [K, N] block (2x2).
#include <algorithm>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/gemm.h"
#include "tensor/ops/cpu/group_pieces.h"
#include "tensor/ops/cpu/loops.h"

namespace dtr {
namespace {

/// True when the GEMM can read the last two dims of t in place (one unit stride).
bool gemm_ok(const Tensor& t) {
  const int64_t d = t.dim();
  const int64_t r = t.sizes()[d - 2], c = t.sizes()[d - 1];
  return t.strides()[d - 1] == 1 || c == 1 || t.strides()[d - 2] == 1 || r == 1;
}
Tensor operand(const Tensor& t) { return gemm_ok(t) ? t : t.contiguous(); }

std::vector<Tensor> k_grouped_mm(const OpCall& c) {
  const Tensor a = operand(c.inputs[0]), b = operand(c.inputs[1]);
  const Shape& sizes = c.shape(0);
  const int64_t G = static_cast<int64_t>(sizes.size());
  Shape offs(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) offs[g + 1] = offs[g] + sizes[g];
  const bool three = b.dim() == 3;  // a [T, K] x b [G, K, N] -> [T, N]; else a [K, T] x b [T, N] -> [G, K, N]
  const int64_t K = three ? a.size(1) : a.size(0), N = three ? b.size(2) : b.size(1);
  Tensor out = empty(three ? Shape{a.size(0), N} : Shape{G, K, N}, TensorOptions(a.dtype()));
  // The row sequence: 2x3 the rows of each group (cost 1 each: K N FLOPs), 2x2 the K rows of
  // each group's block (cost n_g each).
  Shape rows(G);
  std::vector<int64_t> cost(G);
  for (int64_t g = 0; g < G; ++g) {
    rows[g] = three ? sizes[g] : K;
    cost[g] = three ? 1 : sizes[g];
  }
  const int64_t flops = 2 * offs[G] * K * N;
  cpu::dispatch_floating(a.dtype(), "grouped_mm", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    cpu::for_group_pieces(rows, cost, flops, [&](int64_t g, int64_t r0, int64_t r1) {
      const int64_t n = sizes[g], o = offs[g];
      if (three) {
        if (r1 > r0)
          cpu::gemm<T>(r1 - r0, N, K, pa + (o + r0) * a.stride(0), a.stride(0), a.stride(1), pb + g * b.stride(0),
                       b.stride(1), b.stride(2), po + (o + r0) * N, false);
      } else if (n == 0) {
        std::fill(po + g * K * N, po + (g + 1) * K * N, T(0));
      } else if (r1 > r0) {
        cpu::gemm<T>(r1 - r0, N, n, pa + r0 * a.stride(0) + o * a.stride(1), a.stride(0), a.stride(1),
                     pb + o * b.stride(0), b.stride(0), b.stride(1), po + (g * K + r0) * N, false);
      }
    });
  });
  return {out};
}

DTR_REGISTER_KERNEL("grouped_mm", DeviceType::CPU, k_grouped_mm);

}  // namespace
}  // namespace dtr
