// CPU kernel of grouped_mm (see ops/grouped_mm.cpp): cpu::gemm (dtr's SGEMM for f32, Eigen for
// f64) on strided views, no copies for transposed operands. All groups run in one OpenMP region
// with the work split evenly over the threads: the work is a sequence of output rows (2x3: the
// rows of each group, each costing K N; 2x2: the K rows of each group's [K, N] block, each
// costing n_g N), cut into one contiguous range per thread, each range computed as single-
// threaded GEMMs over its pieces of groups. No thread waits for another's last expert (a
// schedule of whole experts left a thread idle for up to one expert's GEMM per call), and a
// group larger than a thread's share (skewed routing) is shared like a parallel GEMM's rows.
// Cuts fall on multiples of 16 rows from a group's start and leave both sides >= 16 rows (a
// smaller group is never cut), so every piece takes the GEMM path its whole group would (SGEMM's
// small-m path is for m <= 8) and, as the f32 GEMM's per-element sums do not depend on how rows
// are split, f32 results are bitwise independent of the thread count. Below kParallelWork
// FLOPs the groups run in turn. Groups of size 0 give zero rows (2x3) or a zero [K, N] block (2x2).
#include <omp.h>

#include <algorithm>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/gemm.h"
#include "tensor/ops/cpu/loops.h"

namespace dtr {
namespace {

/// FLOPs (2 M N K summed over groups) below which the groups run in turn on the calling thread.
constexpr int64_t kParallelWork = 1 << 21;
/// Cuts inside a group fall on multiples of this many rows and leave both sides at least as long.
constexpr int64_t kCutRows = 16;

/// True when the GEMM can read the last two dims of t in place (one unit stride).
bool gemm_ok(const Tensor& t) {
  const int64_t d = t.dim();
  const int64_t r = t.sizes()[d - 2], c = t.sizes()[d - 1];
  return t.strides()[d - 1] == 1 || c == 1 || t.strides()[d - 2] == 1 || r == 1;
}
Tensor operand(const Tensor& t) { return gemm_ok(t) ? t : t.contiguous(); }

/// A position in the row sequence: row r of group g (r == rows of g: the group's end).
struct RowPos {
  int64_t g, r;
};

/// Where the share `target` of the total work (rows[g] rows of cost[g] each, in group order)
/// ends, rounded to a cut kCutRows allows.
RowPos cut_at(const Shape& rows, const std::vector<int64_t>& cost, int64_t target) {
  const int64_t G = static_cast<int64_t>(rows.size());
  int64_t done = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t w = rows[g] * cost[g];
    if (done + w <= target) {
      done += w;
      continue;
    }
    // Inside group g: the nearest multiple of kCutRows, or the group's start / end.
    int64_t r = (target - done + cost[g] / 2) / cost[g];
    r = (r + kCutRows / 2) / kCutRows * kCutRows;
    if (r < kCutRows) r = 0;
    if (rows[g] - r < kCutRows) r = rows[g];
    return {g, r};
  }
  return {G, 0};
}

/// Calls piece(g, r0, r1) once for each non-empty range of rows of a group, the row sequence
/// split evenly by work over the threads of one parallel region (in turn, whole groups, below
/// kParallelWork). A group of cost 0 (2x2, no tokens) is never cut: one thread gets all its rows.
template <class F>
void for_pieces(const Shape& rows, const std::vector<int64_t>& cost, int64_t flops, F piece) {
  const int64_t G = static_cast<int64_t>(rows.size());
  int64_t total = 0;
  for (int64_t g = 0; g < G; ++g) total += rows[g] * cost[g];
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads == 1 || flops < kParallelWork || total == 0) {
    for (int64_t g = 0; g < G; ++g)
      if (rows[g] > 0) piece(g, 0, rows[g]);
    return;
  }
  std::vector<RowPos> cuts(threads + 1);
  cuts[0] = {0, 0};
  cuts[threads] = {G, 0};
  for (int t = 1; t < threads; ++t) cuts[t] = cut_at(rows, cost, total / threads * t + total % threads * t / threads);
  // The region may get fewer threads than asked for (OMP_THREAD_LIMIT, OMP_DYNAMIC): each
  // thread then takes every num_threads-th range, so every range is computed exactly once.
#pragma omp parallel num_threads(threads)
  for (int t = omp_get_thread_num(); t < threads; t += omp_get_num_threads()) {
    const RowPos a = cuts[t], b = cuts[t + 1];
    for (int64_t g = a.g; g <= b.g && g < G; ++g) {
      const int64_t r0 = g == a.g ? a.r : 0, r1 = g == b.g ? b.r : rows[g];
      if (r1 > r0) piece(g, r0, r1);
    }
  }
}

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
    for_pieces(rows, cost, flops, [&](int64_t g, int64_t r0, int64_t r1) {
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
