// The thread schedule of grouped_mm's CPU kernel (grouped_mm_kernels.cpp), in a header of its
// own so that a test can check that it computes every row exactly once.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace dtr::cpu {

/// FLOPs (2 M N K summed over groups) below which the groups run in turn on the calling thread.
inline constexpr int64_t kGroupParallelWork = 1 << 21;
/// Cuts inside a group fall on multiples of this many rows and leave both sides at least as long.
inline constexpr int64_t kGroupCutRows = 16;
/// Pieces per thread's share of the work that the row sequence is cut into (see for_group_pieces).
inline constexpr int64_t kGroupPiecesPerThread = 4;

/// Rows [r0, r1) of group g: one single-threaded GEMM (2x3: those rows of the output; 2x2: those
/// rows of the group's [K, N] block).
struct GroupPiece {
  int64_t g, r0, r1;
};

/// The row sequence cut into pieces of about `target` work each (rows[g] rows of cost[g] each):
/// a group of work < 1.5 target is one piece, a larger one round(work / target) nearly equal
/// pieces cut at multiples of kGroupCutRows rows from its start, each >= kGroupCutRows rows (the
/// last takes the remainder). Largest pieces first (the counter hands out the small ones last, so
/// the threads finish close together); pieces of equal work keep the sequence order.
inline std::vector<GroupPiece> cut_group_pieces(const Shape& rows, const std::vector<int64_t>& cost,
                                                int64_t target) {
  std::vector<GroupPiece> out;
  for (int64_t g = 0; g < static_cast<int64_t>(rows.size()); ++g) {
    if (rows[g] == 0) continue;
    const int64_t units = rows[g] / kGroupCutRows;
    const int64_t p = std::clamp<int64_t>((rows[g] * cost[g] + target / 2) / std::max<int64_t>(target, 1), 1,
                                          std::max<int64_t>(units, 1));
    int64_t r0 = 0;
    for (int64_t i = 1; i <= p; ++i) {
      // r1: round(units i / p) cut units; units / p >= 1 keeps every piece >= one unit
      const int64_t r1 = i == p ? rows[g] : (units * i * 2 + p) / (2 * p) * kGroupCutRows;
      out.push_back({g, r0, r1});
      r0 = r1;
    }
  }
  std::stable_sort(out.begin(), out.end(), [&](const GroupPiece& x, const GroupPiece& y) {
    return (x.r1 - x.r0) * cost[x.g] > (y.r1 - y.r0) * cost[y.g];
  });
  return out;
}

/// Calls piece(g, r0, r1) once for each piece of cut_group_pieces(): the threads of one
/// parallel region take the next piece from a shared counter, so a thread slowed by another
/// process (a vCPU shared with another tenant) computes fewer pieces instead of making the others
/// wait at the join. Pieces of a 1 / kGroupPiecesPerThread of a thread's share (groups up to 1.5x
/// that stay whole: each cut packs the group's B once more). Whole groups in turn when
/// single-threaded or below kGroupParallelWork FLOPs. A group of cost 0 (2x2, no tokens) is never
/// cut: one thread fills its rows.
template <class F>
void for_group_pieces(const Shape& rows, const std::vector<int64_t>& cost, int64_t flops, F piece) {
  const int64_t G = static_cast<int64_t>(rows.size());
  int64_t total = 0;
  for (int64_t g = 0; g < G; ++g) total += rows[g] * cost[g];
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads == 1 || flops < kGroupParallelWork || total == 0) {
    for (int64_t g = 0; g < G; ++g)
      if (rows[g] > 0) piece(g, 0, rows[g]);
    return;
  }
  const std::vector<GroupPiece> pieces =
      cut_group_pieces(rows, cost, total / (threads * kGroupPiecesPerThread));
  const int64_t n = static_cast<int64_t>(pieces.size());
  // Fewer threads than asked for (OMP_THREAD_LIMIT, OMP_DYNAMIC) just take more pieces each.
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(threads, n)))
  for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;)
    piece(pieces[i].g, pieces[i].r0, pieces[i].r1);
}

}  // namespace dtr::cpu
