// swiglu(gate, up) = silu(gate) * up: forward against the silu/mul composition (f64, f32,
// bf16, strided inputs), backward against finite differences and the composition's gradients,
// large |gate| without NaN/Inf, errors on mismatched shapes / dtypes; the joined form
// swiglu(gate_up) against its halves; the weighted joined form swiglu_weighted(gate_up, w)
// against swiglu(gate_up) * w (f64, f32, gradients, bit-equal on 1-3 threads).
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "tensor/dispatch.h"
#include "tensor/ops/nn_swiglu.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {
// f64: the fused kernel and the composition evaluate the same expression up to one rounding
// of the product order, so they agree to a few ulps of values of size ~10.
constexpr double kF64Tol = 1e-12;
// f32: same expression, Eigen's vectorised exp (~1 ulp) in both; values ~10 -> ~1e-6 absolute.
constexpr double kF32Tol = 1e-6;

Tensor leaf(const Shape& s, double lo = -3, double hi = 3) {
  return uniform(s, lo, hi, TensorOptions(DType::f64)).set_requires_grad(true);
}
Tensor composed(const Tensor& g, const Tensor& u) { return mul(silu(g), u); }
bool all_finite(const Tensor& t) {
  for (double v : to_dtype(t, DType::f64).to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}
}  // namespace

TEST_CASE("swiglu forward equals silu(gate) * up", "[swiglu]") {
  manual_seed(11);
  // 70000 elements: above cpu::kParallelGrain (parallel blocks) and not a multiple of the block.
  for (const Shape& s : {Shape{3, 5}, Shape{7, 10000}, Shape{0, 4}}) {
    Tensor g = uniform(s, -6, 6, TensorOptions(DType::f64)), u = uniform(s, -2, 2, TensorOptions(DType::f64));
    CHECK(max_abs_diff(swiglu(g, u), composed(g, u)) < kF64Tol);
    Tensor gf = to_dtype(g, DType::f32), uf = to_dtype(u, DType::f32);
    Tensor y = swiglu(gf, uf);
    CHECK(y.dtype() == DType::f32);
    CHECK(max_abs_diff(y, composed(gf, uf)) < kF32Tol);
  }
  // hand-checked: silu(0) = 0, silu(1) = 1 / (1 + e^-1)
  auto v = swiglu(from_vector<double>({0, 1}, {2}), from_vector<double>({5, 2}, {2})).to_vector<double>();
  CHECK(v[0] == 0.0);
  CHECK(v[1] == Approx(2.0 / (1.0 + std::exp(-1.0))).epsilon(1e-15));
  // bf16 in, bf16 out (upcast by the dispatcher), within bf16 rounding of the f64 value
  Tensor g = uniform({4, 8}, -3, 3, TensorOptions(DType::f64)), u = uniform({4, 8}, -1, 1, TensorOptions(DType::f64));
  Tensor yb = swiglu(to_dtype(g, DType::bf16), to_dtype(u, DType::bf16));
  CHECK(yb.dtype() == DType::bf16);
  CHECK(max_abs_diff(to_dtype(yb, DType::f64), composed(g, u)) < 0.05);
}

TEST_CASE("swiglu on strided inputs", "[swiglu]") {
  manual_seed(12);
  Tensor g = uniform({6, 4}, -3, 3, TensorOptions(DType::f32)), u = uniform({4, 6}, -3, 3, TensorOptions(DType::f32));
  Tensor gt = g.transpose(0, 1);  // [4, 6], non-contiguous
  CHECK_FALSE(gt.is_contiguous());
  CHECK(max_abs_diff(swiglu(gt, u), composed(gt.contiguous(), u)) < kF32Tol);
  auto d = dispatch(OpCall{op_def("swiglu_backward"), {u, gt, u}, {}});
  auto e = dispatch(OpCall{op_def("swiglu_backward"), {u, gt.contiguous(), u}, {}});
  CHECK(max_abs_diff(d[0], e[0]) == 0.0);
  CHECK(max_abs_diff(d[1], e[1]) == 0.0);
}

TEST_CASE("swiglu backward matches finite differences", "[swiglu][grad]") {
  manual_seed(13);
  auto f = [](const std::vector<Tensor>& v) { return swiglu(v[0], v[1]); };
  CHECK(gradcheck(f, {leaf({3, 7}), leaf({3, 7})}) == "");
  CHECK(gradcheck(f, {leaf({2, 3, 4}, -8, 8), leaf({2, 3, 4})}) == "");
  // only one input requires grad
  Tensor up = uniform({5}, -1, 1, TensorOptions(DType::f64));
  CHECK(gradcheck([up](const std::vector<Tensor>& v) { return swiglu(v[0], up); }, {leaf({5})}) == "");
  Tensor gate = uniform({5}, -1, 1, TensorOptions(DType::f64));
  CHECK(gradcheck([gate](const std::vector<Tensor>& v) { return swiglu(gate, v[0]); }, {leaf({5})}) == "");
}

TEST_CASE("swiglu gradients equal the composition's", "[swiglu][grad]") {
  manual_seed(14);
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? kF64Tol : 1e-5;  // f32: gradients ~20, a few ulps
    const Shape s{9, 4000};
    Tensor g0 = uniform(s, -6, 6, TensorOptions(dt)), u0 = uniform(s, -2, 2, TensorOptions(dt));
    Tensor w = normal(s, 0.0, 1.0, TensorOptions(dt));
    Tensor g1 = g0.clone().set_requires_grad(true), u1 = u0.clone().set_requires_grad(true);
    Tensor g2 = g0.clone().set_requires_grad(true), u2 = u0.clone().set_requires_grad(true);
    sum(mul(swiglu(g1, u1), w)).backward();
    sum(mul(composed(g2, u2), w)).backward();
    INFO(dt);
    CHECK(max_abs_diff(g1.grad(), g2.grad()) < tol);
    CHECK(max_abs_diff(u1.grad(), u2.grad()) < tol);
  }
}

TEST_CASE("swiglu(gate_up) equals swiglu of its halves, gradient as one tensor", "[swiglu][grad]") {
  manual_seed(15);
  auto halves = [](const Tensor& x) {
    const int64_t I = x.size(-1) / 2, d = x.dim() - 1;
    return swiglu(x.narrow(d, 0, I), x.narrow(d, I, I));
  };
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return swiglu(v[0]); }, {leaf({3, 8})}) == "");
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return swiglu(v[0]); }, {leaf({2, 3, 6}, -8, 8)}) == "");
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dt);
    Tensor x0 = uniform({70, 1000}, -6, 6, TensorOptions(dt)), w = normal({70, 500}, 0.0, 1.0, TensorOptions(dt));
    Tensor x1 = x0.clone().set_requires_grad(true), x2 = x0.clone().set_requires_grad(true);
    const Tensor y1 = swiglu(x1), y2 = halves(x2);
    CHECK(max_abs_diff(y1, y2) == 0.0);  // the same kernel on the same views
    sum(mul(y1, w)).backward();
    sum(mul(y2, w)).backward();
    CHECK(x1.grad().is_contiguous());
    CHECK(max_abs_diff(x1.grad(), x2.grad()) == 0.0);
    // the halves read in place (rows of 500 with stride 1000, packet tails in every row) equal
    // the contiguous path, forward and swiglu_joined_backward against swiglu_backward + cat
    const Tensor gc = x0.narrow(1, 0, 500).contiguous(), uc = x0.narrow(1, 500, 500).contiguous();
    CHECK(max_abs_diff(y1, swiglu(gc, uc)) == 0.0);
    const auto d = dispatch(OpCall{op_def("swiglu_backward"), {w, gc, uc}, {}});
    CHECK(max_abs_diff(x1.grad(), cat({d[0], d[1]}, 1)) == 0.0);
  }
  // 3-d joined input (leading dims collapse into one row stride)
  Tensor x3 = uniform({4, 3, 34}, -6, 6, TensorOptions(DType::f32));
  CHECK(max_abs_diff(swiglu(x3), swiglu(x3.narrow(2, 0, 17).contiguous(), x3.narrow(2, 17, 17).contiguous())) == 0.0);
  CHECK_THROWS_WITH(swiglu(zeros({2, 3})), Catch::Contains("swiglu: gate_up [2, 3]") && Catch::Contains("even"));
  CHECK_THROWS_WITH(swiglu(zeros({2, 4}, TensorOptions(DType::i64))), Catch::Contains("floating"));
}

TEST_CASE("swiglu_weighted(gate_up, w) equals swiglu(gate_up) * w, gradients included", "[swiglu][grad]") {
  manual_seed(16);
  auto composed_w = [](const Tensor& x, const Tensor& w) { return mul(swiglu(x), unsqueeze(w, -1)); };
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return swiglu_weighted(v[0], v[1]); },
                  {leaf({3, 8}), leaf({3}, 0, 1)}) == "");
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return swiglu_weighted(v[0], v[1]); },
                  {leaf({2, 3, 38}, -8, 8), leaf({2, 3}, -1, 1)}) == "");
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dt);
    // rows of 500: packet tails in every row (the weight gradient's zero-padded lanes)
    const Tensor x0 = uniform({70, 1000}, -6, 6, TensorOptions(dt)), w0 = uniform({70}, 0, 1, TensorOptions(dt));
    const Tensor g = normal({70, 500}, 0.0, 1.0, TensorOptions(dt));
    Tensor x1 = x0.clone().set_requires_grad(true), w1 = w0.clone().set_requires_grad(true);
    Tensor x2 = x0.clone().set_requires_grad(true), w2 = w0.clone().set_requires_grad(true);
    const Tensor y1 = swiglu_weighted(x1, w1), y2 = composed_w(x2, w2);
    const double tol = dt == DType::f64 ? kF64Tol : kF32Tol;
    CHECK(max_abs_diff(y1, y2) < tol);
    sum(mul(y1, g)).backward();
    sum(mul(y2, g)).backward();
    CHECK(max_abs_diff(x1.grad(), x2.grad()) < tol);
    CHECK(max_abs_diff(w1.grad(), w2.grad()) < 500 * tol);  // a sum of 500 products ~10
  }
  // Bit-equal on 1, 2 and 3 threads (rows handed out dynamically; each row's sum in one order).
  const Tensor x = uniform({600, 512}, -6, 6), w = uniform({600}, 0, 1), g = randn({600, 256});
  auto run = [&] {
    Tensor xl = x.clone().set_requires_grad(true), wl = w.clone().set_requires_grad(true);
    const Tensor y = swiglu_weighted(xl, wl);
    sum(mul(y, g)).backward();
    return std::vector<Tensor>{y.detach(), xl.grad(), wl.grad()};
  };
  CHECK(dtr::testing::same_bits_on_threads(run) == "");
  // A layer-sized call (rows handed out dynamically over many blocks): the same bits as the rows
  // computed alone.
  {
    const int64_t R = 8200, I = 256;  // out [8200, 256] f32 = 8.4 MB, d gate_up 16.8 MB
    const Tensor xb = uniform({R, 2 * I}, -6, 6), wb = uniform({R}, 0, 1), gb = randn({R, I});
    Tensor xl = xb.clone().set_requires_grad(true), wl = wb.clone().set_requires_grad(true);
    const Tensor y = swiglu_weighted(xl, wl);
    sum(mul(y, gb)).backward();
    for (int64_t r0 : {int64_t(0), int64_t(4001), R - 37}) {
      INFO("rows from " << r0);
      Tensor xs = xb.narrow(0, r0, 37).clone().set_requires_grad(true), ws = wb.narrow(0, r0, 37).clone().set_requires_grad(true);
      const Tensor ys = swiglu_weighted(xs, ws);
      sum(mul(ys, gb.narrow(0, r0, 37))).backward();
      CHECK(max_abs_diff(ys, y.narrow(0, r0, 37)) == 0.0);
      CHECK(max_abs_diff(xs.grad(), xl.grad().narrow(0, r0, 37)) == 0.0);
      CHECK(max_abs_diff(ws.grad(), wl.grad().narrow(0, r0, 37)) == 0.0);
    }
  }
  CHECK_THROWS_WITH(swiglu_weighted(zeros({2, 4}), zeros({3})), Catch::Contains("swiglu_weighted: weights [3]"));
  CHECK_THROWS_WITH(swiglu_weighted(zeros({2, 4}), zeros({2}, TensorOptions(DType::f64))),
                    Catch::Contains("float64"));
  CHECK_THROWS_WITH(swiglu_weighted(zeros({2, 3}), zeros({2})), Catch::Contains("even"));
}

TEST_CASE("grouped_mm_swiglu equals swiglu_weighted(grouped_mm(...)): values, gradients, bits", "[swiglu][grad]") {
  manual_seed(17);
  // f64 gradients by finite differences (x, the expert weights, the row weights; an empty group)
  const Shape small{2, 0, 3};
  CHECK(gradcheck(
            [&](const std::vector<Tensor>& v) { return grouped_mm_swiglu(v[0], v[1].transpose(1, 2), small, v[2]); },
            {leaf({5, 4}, -1, 1), leaf({3, 6, 4}, -1, 1), leaf({5}, 0, 1)}) == "");
  // f32 at a layer-like size (skewed groups: one cut into pieces; empty groups): the bits of the
  // two ops, forward and every gradient, on 1-3 threads
  const Shape sizes{0, 9, 700, 40, 0, 16, 300};
  const int64_t T = 1065;
  const Tensor x = uniform({T, 64}, -1, 1), w1 = uniform({7, 96, 64}, -0.3, 0.3), rw = uniform({T}, 0, 1);
  const Tensor g = randn({T, 48});
  auto run = [&](bool fused) {
    Tensor xl = x.clone().set_requires_grad(true), wl = w1.clone().set_requires_grad(true),
           rl = rw.clone().set_requires_grad(true);
    const Tensor h = fused ? grouped_mm_swiglu(xl, wl.transpose(1, 2), sizes, rl)
                           : swiglu_weighted(grouped_mm(xl, wl.transpose(1, 2), sizes), rl);
    sum(mul(h, g)).backward();
    return std::vector<Tensor>{h.detach(), xl.grad(), wl.grad(), rl.grad()};
  };
  const std::vector<Tensor> a = run(true), b = run(false);
  for (size_t i = 0; i < a.size(); ++i) CHECK(max_abs_diff(a[i], b[i]) == 0.0);
  CHECK(dtr::testing::same_bits_on_threads([&] { return run(true); }) == "");
  // bf16: gate_up rounded to bf16 before the SwiGLU, as the two ops do (an empty group)
  const Shape bsizes{3, 0, 40, 9};
  const Tensor xb = to_dtype(uniform({52, 64}, -1, 1), DType::bf16);
  const Tensor wb = to_dtype(uniform({4, 96, 64}, -0.3, 0.3), DType::bf16), rb = to_dtype(uniform({52}, 0, 1), DType::bf16);
  CHECK(max_abs_diff(to_dtype(grouped_mm_swiglu(xb, wb.transpose(1, 2), bsizes, rb), DType::f64),
                     to_dtype(swiglu_weighted(grouped_mm(xb, wb.transpose(1, 2), bsizes), rb), DType::f64)) == 0.0);
  // the fused CPU kernel itself refuses bf16 (it would apply the SwiGLU to the unrounded gate_up)
  CHECK_THROWS_WITH(dispatch(OpCall{op_def("grouped_mm_swiglu"), {xb, wb.transpose(1, 2), rb}, {bsizes}}),
                    Catch::Contains("grouped_mm_swiglu: the CPU kernel takes f32 / f64"));
  CHECK_THROWS_WITH(grouped_mm_swiglu(x, w1.transpose(1, 2), sizes, zeros({3})),
                    Catch::Contains("grouped_mm_swiglu: weights [3]"));
  CHECK_THROWS_WITH(grouped_mm_swiglu(x, w1.narrow(1, 0, 95).transpose(1, 2), sizes, rw), Catch::Contains("[7, 64, 95]"));
  CHECK_THROWS_WITH(grouped_mm_swiglu(x, w1.transpose(1, 2), Shape{1, 2}, rw), Catch::Contains("grouped_mm"));
}

TEST_CASE("swiglu at large |gate| stays finite", "[swiglu]") {
  // exp(-gate) overflows (f32 beyond 88.7) for gate = -90: s -> 0, silu -> 0, no NaN.
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor g = to_dtype(from_vector<double>({-90, -30, 30, 90, -90, 90}, {6}), dt).set_requires_grad(true);
    Tensor u = to_dtype(from_vector<double>({2, 2, 2, 2, -1, -1}, {6}), dt).set_requires_grad(true);
    Tensor y = swiglu(g, u);
    INFO(dt);
    CHECK(all_finite(y));
    auto v = to_dtype(y, DType::f64).to_vector<double>();
    CHECK(std::abs(v[0]) < 1e-30);
    CHECK(v[1] == Approx(-30.0 * 2.0 / (1.0 + std::exp(30.0))).epsilon(1e-5));
    CHECK(v[2] == Approx(60.0).epsilon(1e-6));
    CHECK(v[3] == Approx(180.0).epsilon(1e-6));
    sum(y).backward();
    CHECK(all_finite(g.grad()));
    CHECK(all_finite(u.grad()));
    auto dg = to_dtype(g.grad(), DType::f64).to_vector<double>();
    CHECK(dg[3] == Approx(2.0).epsilon(1e-6));  // d/dx silu -> 1 for large x
    CHECK(std::abs(dg[0]) < 1e-30);             // -> 0 for very negative x
  }
}

TEST_CASE("swiglu rejects mismatched inputs", "[swiglu]") {
  CHECK_THROWS_WITH(swiglu(zeros({2, 3}), zeros({3, 2})), Catch::Contains("swiglu") && Catch::Contains("[2, 3]") &&
                                                              Catch::Contains("same shape"));
  CHECK_THROWS_WITH(swiglu(zeros({2, 3}), zeros({1, 3})), Catch::Contains("same shape"));
  CHECK_THROWS_WITH(swiglu(zeros({2}), zeros({2}, TensorOptions(DType::f64))),
                    Catch::Contains("swiglu: dtype mismatch") && Catch::Contains("float64"));
  CHECK_THROWS_WITH(swiglu(zeros({2}, TensorOptions(DType::i64)), zeros({2}, TensorOptions(DType::i64))),
                    Catch::Contains("floating"));
}
