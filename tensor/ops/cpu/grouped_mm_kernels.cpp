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
// grouped_mm_pair runs the two products of a backward (dA, dB) through one such queue;
// grouped_mm_swiglu follows each piece's GEMM with the weighted SwiGLU of its rows.
#include <algorithm>

#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/ops/cpu/gemm.h"
#include "tensor/ops/cpu/group_pieces.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cpu/swiglu_rows.h"

namespace dtr {
namespace {

/// True when the GEMM can read the last two dims of t in place (one unit stride).
bool gemm_ok(const Tensor& t) {
  const int64_t d = t.dim();
  const int64_t r = t.sizes()[d - 2], c = t.sizes()[d - 1];
  return t.strides()[d - 1] == 1 || c == 1 || t.strides()[d - 2] == 1 || r == 1;
}
Tensor operand(const Tensor& t) { return gemm_ok(t) ? t : t.contiguous(); }

/// One grouped product: its operands (readable in place), output and row sequence (2x3: the rows
/// of each group, cost 1 each = K N FLOPs; 2x2: the K rows of each group's block, cost n_g each).
struct GroupedProduct {
  Tensor a, b, out;
  Shape sizes, offs, rows;
  std::vector<int64_t> cost;
  bool three;  // a [T, K] x b [G, K, N] -> [T, N]; else a [K, T] x b [T, N] -> [G, K, N]
  int64_t K, N, flops;

  GroupedProduct(const Tensor& a0, const Tensor& b0, const Shape& group_sizes)
      : a(operand(a0)), b(operand(b0)), sizes(group_sizes), three(b0.dim() == 3) {
    const int64_t G = static_cast<int64_t>(sizes.size());
    offs.assign(G + 1, 0);
    for (int64_t g = 0; g < G; ++g) offs[g + 1] = offs[g] + sizes[g];
    K = three ? a.size(1) : a.size(0);
    N = three ? b.size(2) : b.size(1);
    out = empty(three ? Shape{a.size(0), N} : Shape{G, K, N}, TensorOptions(a.dtype()));
    rows.resize(G);
    cost.resize(G);
    for (int64_t g = 0; g < G; ++g) {
      rows[g] = three ? sizes[g] : K;
      cost[g] = three ? 1 : sizes[g];
    }
    flops = 2 * offs[G] * K * N;
  }
  /// FLOPs / 2 of one cost unit (to put two products' row sequences on one scale).
  int64_t unit() const { return three ? K * N : N; }

  /// Rows [r0, r1) of group g: one single-threaded GEMM (zeros for an empty 2x2 group).
  template <class T>
  void piece(int64_t g, int64_t r0, int64_t r1) const {
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
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
  }
};

std::vector<Tensor> k_grouped_mm(const OpCall& c) {
  const GroupedProduct p(c.inputs[0], c.inputs[1], c.shape(0));
  cpu::dispatch_floating(p.a.dtype(), "grouped_mm", [&](auto tag) {
    using T = decltype(tag);
    cpu::for_group_pieces(p.rows, p.cost, p.flops,
                          [&](int64_t g, int64_t r0, int64_t r1) { p.piece<T>(g, r0, r1); });
  });
  return {p.out};
}

/// {a1, b1, a2, b2} attrs {group sizes} -> {grouped_mm(a1, b1), grouped_mm(a2, b2)}: the two
/// products of a grouped_mm backward (dA and dB) in one parallel region, their pieces in one
/// queue (costs on one FLOP scale), so the threads wait at one join instead of two and the last
/// pieces of one product fill the other's tail. Each piece is the GEMM the single op would run
/// on those rows, so the results have the bits of two grouped_mm calls.
std::vector<Tensor> k_grouped_mm_pair(const OpCall& c) {
  const GroupedProduct p(c.inputs[0], c.inputs[1], c.shape(0)), q(c.inputs[2], c.inputs[3], c.shape(0));
  DTR_CHECK(p.a.dtype() == q.a.dtype(), "grouped_mm_pair: dtypes ", p.a.dtype(), " and ", q.a.dtype());
  const int64_t G = static_cast<int64_t>(p.rows.size());
  Shape rows = p.rows;
  rows.insert(rows.end(), q.rows.begin(), q.rows.end());
  std::vector<int64_t> cost(2 * G);
  for (int64_t g = 0; g < G; ++g) {
    cost[g] = p.cost[g] * p.unit();
    cost[G + g] = q.cost[g] * q.unit();
  }
  cpu::dispatch_floating(p.a.dtype(), "grouped_mm_pair", [&](auto tag) {
    using T = decltype(tag);
    cpu::for_group_pieces(rows, cost, p.flops + q.flops, [&](int64_t i, int64_t r0, int64_t r1) {
      if (i < G)
        p.piece<T>(i, r0, r1);
      else
        q.piece<T>(i - G, r0, r1);
    });
  });
  return {p.out, q.out};
}

/// {x [T, K], w [G, K, 2I], weights [T]} attrs {sizes} -> {gate_up = grouped_mm(x, w) [T, 2I],
/// h = swiglu_weighted(gate_up, weights) [T, I]}: each piece's rows of h computed right after
/// its GEMM wrote them (a piece's [rows, 2I] block is still in the cache; the separate SwiGLU
/// pass read all of gate_up back from memory). Same pieces and GEMMs as grouped_mm, the SwiGLU
/// kernel's row loop: the bits of the two ops. f32 / f64 only (registered without the dispatcher's
/// upcast: in bf16 the two ops round gate_up before the SwiGLU, and grouped_mm_swiglu() runs them).
std::vector<Tensor> k_grouped_mm_swiglu(const OpCall& c) {
  DTR_CHECK(!is_low_precision(c.inputs[0].dtype()), "grouped_mm_swiglu: the CPU kernel takes f32 / f64, got ",
            c.inputs[0].dtype(), " (grouped_mm_swiglu() runs grouped_mm + swiglu_weighted for bf16 / f16)");
  const GroupedProduct p(c.inputs[0], c.inputs[1], c.shape(0));
  const Tensor w = c.inputs[2].is_contiguous() ? c.inputs[2] : contiguous(c.inputs[2].detach());
  const int64_t T = p.out.size(0), I = p.N / 2;
  DTR_CHECK(p.three && p.N % 2 == 0 && w.dim() == 1 && w.size(0) == T && w.dtype() == p.a.dtype(),
            "grouped_mm_swiglu: w ", c.inputs[1].sizes(), " and weights ", w.sizes(), " ", w.dtype(),
            " (expected [G, K, 2I] and [", T, "] ", p.a.dtype(), ")");
  Tensor h = empty({T, I}, TensorOptions(p.a.dtype()));
  cpu::dispatch_floating(p.a.dtype(), "grouped_mm_swiglu", [&](auto tag) {
    using U = decltype(tag);
    const U* pgu = static_cast<const U*>(p.out.data_ptr());
    const U* pw = static_cast<const U*>(w.data_ptr());
    U* ph = static_cast<U*>(h.data_ptr());
    cpu::for_group_pieces(p.rows, p.cost, p.flops, [&](int64_t g, int64_t r0, int64_t r1) {
      p.piece<U>(g, r0, r1);
      cpu::swiglu_weighted_rows<U>(pgu, pw, ph, p.offs[g] + r0, p.offs[g] + r1, I);
    });
  });
  return {p.out, h};
}

DTR_REGISTER_KERNEL("grouped_mm", DeviceType::CPU, k_grouped_mm);
DTR_REGISTER_KERNEL_EXACT("grouped_mm_swiglu", DeviceType::CPU, k_grouped_mm_swiglu);
DTR_REGISTER_KERNEL("grouped_mm_pair", DeviceType::CPU, k_grouped_mm_pair);

}  // namespace
}  // namespace dtr
