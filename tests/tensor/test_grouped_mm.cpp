// grouped_mm: both forms against a loop of per-group mm (f64, f32, bf16; empty groups, one group
// holding every row, transposed operands, groups large enough for the parallel-inside path),
// backward against finite differences (f64) and the loop's gradients, the transposed-weight
// gradient layout, and the errors.
#include <catch2/catch.hpp>
#include <omp.h>

#include <atomic>
#include <limits>
#include <vector>

#include "gradcheck.h"
#include "tensor/dispatch.h"
#include "tensor/ops/cpu/group_pieces.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {
// f64: the same dot products as mm in another blocking: a few ulps of values ~sqrt(K).
constexpr double kF64Tol = 1e-12;
// f32: per-element sums of K <= 96 products of values in [-1, 1] (~1e-6 relative).
constexpr double kF32Tol = 2e-5;

Tensor rnd(const Shape& s, DType dt = DType::f64) { return uniform(s, -1, 1, TensorOptions(dt)); }

/// The reference: mm per group, concatenated (2x3) or stacked (2x2).
Tensor loop_2x3(const Tensor& a, const Tensor& b, const Shape& sizes) {
  std::vector<Tensor> rows;
  int64_t off = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    rows.push_back(mm(a.narrow(0, off, sizes[g]), b.narrow(0, g, 1).squeeze(0)));
    off += sizes[g];
  }
  return cat(rows, 0);
}
Tensor loop_2x2(const Tensor& a, const Tensor& b, const Shape& sizes) {
  std::vector<Tensor> blocks;
  int64_t off = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    blocks.push_back(unsqueeze(mm(a.narrow(1, off, sizes[g]), b.narrow(0, off, sizes[g])), 0));
    off += sizes[g];
  }
  return cat(blocks, 0);
}
int64_t total(const Shape& s) {
  int64_t t = 0;
  for (int64_t v : s) t += v;
  return t;
}
}  // namespace

TEST_CASE("grouped_mm 2x3 equals a loop of per-group mm", "[grouped_mm]") {
  manual_seed(1);
  // uneven groups with empty ones, every row in one group, all groups empty but one row
  for (const Shape& sizes : {Shape{3, 0, 5, 1}, Shape{0, 9, 0}, Shape{1}, Shape{0, 0, 1, 0}}) {
    const int64_t T = total(sizes), G = static_cast<int64_t>(sizes.size());
    Tensor a = rnd({T, 7}), b = rnd({G, 7, 6});
    CHECK(max_abs_diff(grouped_mm(a, b, sizes), loop_2x3(a, b, sizes)) < kF64Tol);
    Tensor af = to_dtype(a, DType::f32), bf = to_dtype(b, DType::f32);
    CHECK(max_abs_diff(grouped_mm(af, bf, sizes), loop_2x3(af, bf, sizes)) < kF32Tol);
    // b as the transposed view of experts stored [G, N, K] (HF's [E, out, in]), a transposed view
    Tensor w = rnd({G, 6, 7});
    Tensor at = rnd({7, T}).t();
    CHECK(max_abs_diff(grouped_mm(at, w.transpose(1, 2), sizes), loop_2x3(at, w.transpose(1, 2), sizes)) < kF64Tol);
  }
  // no rows at all
  CHECK(grouped_mm(rnd({0, 4}), rnd({2, 4, 3}), {0, 0}).sizes() == Shape{0, 3});
}

TEST_CASE("grouped_mm 2x2 equals a loop of per-group mm", "[grouped_mm]") {
  manual_seed(2);
  for (const Shape& sizes : {Shape{3, 0, 5, 1}, Shape{0, 9, 0}, Shape{0, 0}}) {
    const int64_t T = total(sizes), G = static_cast<int64_t>(sizes.size());
    Tensor a = rnd({T, 7}).t(), b = rnd({T, 6});  // a as the transpose of activations [T, K]
    Tensor out = grouped_mm(a, b, sizes);
    CHECK(out.sizes() == Shape{G, 7, 6});
    CHECK(max_abs_diff(out, loop_2x2(a, b, sizes)) < kF64Tol);
    Tensor af = to_dtype(a, DType::f32), bf = to_dtype(b, DType::f32);
    CHECK(max_abs_diff(grouped_mm(af, bf, sizes), loop_2x2(af, bf, sizes)) < kF32Tol);
  }
}

TEST_CASE("grouped_mm large groups (GEMM parallel inside) and many small ones (parallel over groups)",
          "[grouped_mm]") {
  manual_seed(3);
  // 300 x 96 x 128 = 3.7M FLOP per group: above the small-group threshold
  const Shape big{300, 0, 17};
  Tensor a = rnd({317, 96}, DType::f32), b = rnd({3, 96, 128}, DType::f32);
  CHECK(max_abs_diff(grouped_mm(a, b, big), loop_2x3(a, b, big)) < kF32Tol);
  Tensor g = rnd({317, 64}, DType::f32);
  CHECK(max_abs_diff(grouped_mm(a.t(), g, big), loop_2x2(a.t(), g, big)) < 1e-4);  // sums of 300 products
  Shape many(40, 3);
  many[7] = 0;
  Tensor a2 = rnd({total(many), 16}, DType::f32), b2 = rnd({40, 16, 24}, DType::f32);
  CHECK(max_abs_diff(grouped_mm(a2, b2, many), loop_2x3(a2, b2, many)) < kF32Tol);
  // balanced large groups (8 x 2.4M FLOP, none above a thread's share): one GEMM per thread;
  // bit-equal to the same groups run one after another (each GEMM parallel inside), as
  // the f32 GEMM's results do not depend on the thread count
  const Shape even{190, 200, 210, 200, 195, 205, 200, 200};
  Tensor a3 = rnd({total(even), 96}, DType::f32), b3 = rnd({8, 96, 128}, DType::f32);
  const Tensor one_by_one = loop_2x3(a3, b3, even);
  CHECK(max_abs_diff(grouped_mm(a3, b3, even), one_by_one) == 0);
  CHECK(max_abs_diff(grouped_mm(a3.t(), a3, even), loop_2x2(a3.t(), a3, even)) == 0);
}

TEST_CASE("grouped_mm splits the work evenly over threads: f32 bit-equal for any thread count", "[grouped_mm]") {
  manual_seed(7);
  // Empty groups, groups below the 16-row cut unit, one group above a thread's share; 2 * 600 * 64
  // * 80 FLOPs (above the parallel threshold); on 2-4 threads cuts land inside groups (2x3, 2
  // threads: groups 2 and 6 in 4 and 3 pieces of ~75 rows, cut at rows 80, 144, 224 and 80, 160).
  const Shape sizes{0, 5, 300, 17, 0, 33, 245};
  Tensor a = rnd({600, 64}, DType::f32), b = rnd({7, 64, 80}, DType::f32), w = rnd({7, 80, 64}, DType::f32);
  Tensor g = rnd({600, 80}, DType::f32);
  const Tensor r23 = loop_2x3(a, b, sizes), r23t = loop_2x3(a, w.transpose(1, 2), sizes);
  const Tensor r22 = loop_2x2(a.t(), g, sizes), r22t = loop_2x2(g.t(), a, sizes);
  const Tensor a64 = to_dtype(a, DType::f64), g64 = to_dtype(g, DType::f64);
  const Tensor r22_64 = loop_2x2(a64.t(), g64, sizes);
  // rank-8 products (LoRA on experts: SGEMM's skinny paths), a row-major and a transposed view;
  // K = 256 keeps them above the parallel threshold (2 * 600 * 256 * 8 FLOPs)
  Tensor a8 = rnd({600, 256}, DType::f32), b8 = rnd({7, 256, 8}, DType::f32), at = rnd({256, 600}, DType::f32).t();
  const Tensor r8 = loop_2x3(a8, b8, sizes), r8t = loop_2x3(at, b8, sizes);
  const int saved = omp_get_max_threads();
  for (int t : {1, 2, 3, 4}) {
    omp_set_num_threads(t);
    INFO("threads " << t);
    CHECK(max_abs_diff(grouped_mm(a, b, sizes), r23) == 0);
    CHECK(max_abs_diff(grouped_mm(a, w.transpose(1, 2), sizes), r23t) == 0);
    CHECK(max_abs_diff(grouped_mm(a.t(), g, sizes), r22) == 0);
    CHECK(max_abs_diff(grouped_mm(g.t(), a, sizes), r22t) == 0);
    CHECK(max_abs_diff(grouped_mm(a64.t(), g64, sizes), r22_64) < 1e-11);  // f64 (Eigen): within rounding
    CHECK(max_abs_diff(grouped_mm(a8, b8, sizes), r8) == 0);
    CHECK(max_abs_diff(grouped_mm(at, b8, sizes), r8t) == 0);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("grouped_mm's thread schedule computes every row exactly once, cut on 16-row multiples",
          "[grouped_mm]") {
  using cpu::kGroupCutRows;
  // 2x3 rows (cost 1 per row) of skewed groups (one with most rows), empty ones, groups below one
  // cut unit, many small ones; 2x2 blocks of 48 rows costing the group's tokens (0: never cut)
  Shape skewed{0, 5, 2000, 17, 0, 33, 245, 16, 31, 1}, many(100, 7), one{4099};
  many[3] = 0;
  const Shape tokens{0, 900, 3, 0, 64, 16};
  struct Case {
    Shape rows;
    std::vector<int64_t> cost;
  };
  std::vector<Case> cases = {{skewed, std::vector<int64_t>(skewed.size(), 1)},
                             {many, std::vector<int64_t>(many.size(), 1)},
                             {one, {1}},
                             {Shape(tokens.size(), 48), tokens}};
  const int saved = omp_get_max_threads();
  for (size_t c = 0; c < cases.size(); ++c)
    for (int t : {1, 2, 3, 4}) {
      omp_set_num_threads(t);
      INFO("case " << c << ", threads " << t);
      const Shape& rows = cases[c].rows;
      std::vector<std::vector<std::atomic<int>>> seen(rows.size());
      for (size_t g = 0; g < rows.size(); ++g) seen[g] = std::vector<std::atomic<int>>(rows[g]);
      std::atomic<int> pieces{0}, bad_cuts{0};
      cpu::for_group_pieces(rows, cases[c].cost, cpu::kGroupParallelWork, [&](int64_t g, int64_t r0, int64_t r1) {
        pieces.fetch_add(1);
        const bool whole = r0 == 0 && r1 == rows[g];
        const bool on_unit = r0 % kGroupCutRows == 0 && (r1 == rows[g] || r1 % kGroupCutRows == 0);
        if (!whole && (!on_unit || r1 - r0 < kGroupCutRows)) bad_cuts.fetch_add(1);
        for (int64_t r = r0; r < r1; ++r) seen[g][r].fetch_add(1);
      });
      CHECK(bad_cuts.load() == 0);
      int64_t wrong = 0;
      for (size_t g = 0; g < rows.size(); ++g)
        for (const auto& v : seen[g]) wrong += v.load() != 1;
      CHECK(wrong == 0);
      // more pieces than threads: the large groups are cut (the dynamic schedule has work to hand out)
      if (t > 1 && c != 1) CHECK(pieces.load() > t + 1);
    }
  omp_set_num_threads(saved);
}

TEST_CASE("grouped_mm f32 on 2 and 3 threads bit-equal to 1 thread: skewed groups, many pieces",
          "[grouped_mm]") {
  manual_seed(8);
  // one expert with most rows (cut into many pieces), empty experts, experts below a cut unit
  const Shape sizes{0, 7, 1500, 40, 0, 16, 300, 1, 0, 180};
  const int64_t T = total(sizes), G = static_cast<int64_t>(sizes.size());
  Tensor a = rnd({T, 96}, DType::f32), b = rnd({G, 96, 80}, DType::f32), g = rnd({T, 80}, DType::f32);
  const int saved = omp_get_max_threads();
  // Poisons the allocator's cached block of `shape` with NaN, so that a row left uncomputed shows.
  auto poison = [](const Shape& shape) {
    (void)full(shape, std::numeric_limits<double>::quiet_NaN(), TensorOptions(DType::f32));
  };
  omp_set_num_threads(1);
  const Tensor r23 = grouped_mm(a, b, sizes), r22 = grouped_mm(a.t(), g, sizes);
  for (int t : {2, 3}) {
    omp_set_num_threads(t);
    INFO("threads " << t);
    poison({T, 80});
    CHECK(dtr::testing::allclose(grouped_mm(a, b, sizes), r23, 0, 0));  // bit-equal, NaN unequal
    poison({G, 96, 80});
    CHECK(dtr::testing::allclose(grouped_mm(a.t(), g, sizes), r22, 0, 0));
  }
  omp_set_num_threads(saved);
  CHECK(max_abs_diff(r23, loop_2x3(a, b, sizes)) < 1e-4);
}

TEST_CASE("grouped_mm backward's two products in one op (grouped_mm_pair) have the bits of two calls",
          "[grouped_mm][grad]") {
  manual_seed(9);
  // skewed groups (one cut into many pieces), empty groups, one below a cut unit; the expert
  // layout (w [G, N, K] used transposed) and a plain [G, K, N] b
  const Shape sizes{0, 7, 900, 40, 0, 16, 300, 180};
  const int64_t T = total(sizes), G = static_cast<int64_t>(sizes.size());
  const Tensor a = rnd({T, 96}, DType::f32), w = rnd({G, 80, 96}, DType::f32), b = rnd({G, 96, 80}, DType::f32);
  const Tensor g = rnd({T, 80}, DType::f32), g22 = rnd({G, 96, 80}, DType::f32);
  static const OpDef* pair = op_def("grouped_mm_pair");
  auto run = [&] {
    std::vector<Tensor> out;
    // the pair on its own: both forms, a transposed view among the operands
    for (const Tensor& t : dispatch(OpCall{pair, {g, w, g.t(), a}, {sizes}})) out.push_back(t);
    for (const Tensor& t : dispatch(OpCall{pair, {a.t(), g, a, b}, {sizes}})) out.push_back(t);
    // and through autograd: the backward of the expert form and of the 2x2 form
    for (const bool expert : {true, false}) {
      Tensor al = a.clone().set_requires_grad(true), bl = (expert ? w : b).clone().set_requires_grad(true);
      sum(mul(grouped_mm(al, expert ? bl.transpose(1, 2) : bl, sizes), g)).backward();
      out.push_back(al.grad());
      out.push_back(bl.grad());
    }
    Tensor at = a.clone().set_requires_grad(true), gt = g.clone().set_requires_grad(true);
    sum(mul(grouped_mm(at.t(), gt, sizes), g22)).backward();
    out.push_back(at.grad());
    out.push_back(gt.grad());
    return out;
  };
  const std::vector<Tensor> got = run();
  CHECK(max_abs_diff(got[0], grouped_mm(g, w, sizes)) == 0);
  CHECK(max_abs_diff(got[1], grouped_mm(g.t(), a, sizes)) == 0);
  CHECK(max_abs_diff(got[2], grouped_mm(a.t(), g, sizes)) == 0);
  CHECK(max_abs_diff(got[3], grouped_mm(a, b, sizes)) == 0);
  // the expert form's gradients: da = g W, dW formed transposed (g^T a per group), as two calls
  CHECK(max_abs_diff(got[4], grouped_mm(g, w, sizes)) == 0);
  CHECK(max_abs_diff(got[5], grouped_mm(g.t(), a, sizes)) == 0);
  CHECK(got[5].is_contiguous());
  CHECK(max_abs_diff(got[6], grouped_mm(g, b.transpose(1, 2), sizes)) == 0);
  CHECK(max_abs_diff(got[7], grouped_mm(a.t(), g, sizes)) == 0);
  CHECK(max_abs_diff(got[8], grouped_mm(g, g22.transpose(1, 2), sizes)) == 0);  // 2x2 form: d(a^T)
  CHECK(max_abs_diff(got[9], grouped_mm(a, g22, sizes)) == 0);                     // and db
  CHECK(dtr::testing::same_bits_on_threads(run, {2, 3, 4}) == "");
}

TEST_CASE("grouped_mm bf16 computes in f32 and rounds once", "[grouped_mm]") {
  manual_seed(4);
  const Shape sizes{2, 0, 3};
  Tensor a = rnd({5, 8}), b = rnd({3, 8, 4});
  Tensor y = grouped_mm(to_dtype(a, DType::bf16), to_dtype(b, DType::bf16), sizes);
  CHECK(y.dtype() == DType::bf16);
  Tensor ref = loop_2x3(to_dtype(to_dtype(a, DType::bf16), DType::f64), to_dtype(to_dtype(b, DType::bf16), DType::f64), sizes);
  // one bf16 rounding of values |y| <= 8: 2^-8 relative
  CHECK(max_abs_diff(to_dtype(y, DType::f64), ref) < 8.0 / 256);
}

TEST_CASE("grouped_mm backward matches finite differences", "[grouped_mm][grad]") {
  manual_seed(5);
  const Shape sizes{2, 0, 3, 1};
  auto f23 = [sizes](const std::vector<Tensor>& v) { return grouped_mm(v[0], v[1], sizes); };
  CHECK(gradcheck(f23, {rnd({6, 5}).set_requires_grad(true), rnd({4, 5, 3}).set_requires_grad(true)}) == "");
  // the transposed-weight form (experts stored [G, N, K])
  auto f23t = [sizes](const std::vector<Tensor>& v) { return grouped_mm(v[0], v[1].transpose(1, 2), sizes); };
  CHECK(gradcheck(f23t, {rnd({6, 5}).set_requires_grad(true), rnd({4, 3, 5}).set_requires_grad(true)}) == "");
  auto f22 = [sizes](const std::vector<Tensor>& v) { return grouped_mm(v[0].t(), v[1], sizes); };
  CHECK(gradcheck(f22, {rnd({6, 5}).set_requires_grad(true), rnd({6, 3}).set_requires_grad(true)}) == "");
}

TEST_CASE("grouped_mm gradients equal the per-group loop's; weight gradient in the weight's layout",
          "[grouped_mm][grad]") {
  manual_seed(6);
  const Shape sizes{4, 0, 2};
  Tensor a = rnd({6, 5}).set_requires_grad(true), w = rnd({3, 7, 5}).set_requires_grad(true);
  Tensor wt = rnd({6, 7});
  sum(mul(grouped_mm(a, w.transpose(1, 2), sizes), wt)).backward();
  Tensor a2 = a.detach().clone().set_requires_grad(true), w2 = w.detach().clone().set_requires_grad(true);
  sum(mul(loop_2x3(a2, w2.transpose(1, 2), sizes), wt)).backward();
  CHECK(max_abs_diff(a.grad(), a2.grad()) < kF64Tol);
  CHECK(max_abs_diff(w.grad(), w2.grad()) < kF64Tol);
  CHECK(w.grad().is_contiguous());  // formed transposed, no copy before the optimizer / FSDP
  // the empty group's weight gets a zero gradient (not undefined, not garbage)
  CHECK(max_abs_diff(w.grad().narrow(0, 1, 1), zeros({1, 7, 5}, TensorOptions(DType::f64))) == 0.0);
}

TEST_CASE("grouped_mm errors name the shapes", "[grouped_mm]") {
  Tensor a = rnd({5, 4}), b = rnd({2, 4, 3});
  CHECK_THROWS_WITH(grouped_mm(a, b, {2, 2}), Catch::Contains("sum to 4") && Catch::Contains("5 rows"));
  CHECK_THROWS_WITH(grouped_mm(a, b, {5}), Catch::Contains("2 groups but 1 group sizes"));
  CHECK_THROWS_WITH(grouped_mm(a, rnd({2, 3, 3}), {2, 3}), Catch::Contains("inner dims differ"));
  CHECK_THROWS_WITH(grouped_mm(a, b, {6, -1}), Catch::Contains("negative group size"));
  CHECK_THROWS_WITH(grouped_mm(a, to_dtype(b, DType::f32), {2, 3}), Catch::Contains("dtype"));
  CHECK_THROWS_WITH(grouped_mm(rnd({4}), b, {2, 3}), Catch::Contains("expected a 2-d"));
  CHECK_THROWS_WITH(grouped_mm(a.t(), rnd({5, 3}), {2, 2}), Catch::Contains("shared dim"));
}
