// geglu(gate, up) = gelu(gate, approximate=tanh) * up (Gemma's MLP gating): forward against the
// gelu/mul composition (f64, f32, bf16, strided and row-strided inputs) and a hand-computed
// value, backward against f64 finite differences and the composition's gradients, large |gate|
// without NaN/Inf, errors on mismatched shapes / dtypes.
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
// f64: 0.5 x (1 + tanh(u)) and x * sigmoid(2u) agree to a few ulps of values of size ~10.
constexpr double kF64Tol = 1e-12;
// f32 against the f64 value: values up to ~20, f32 rounding ~1e-6 each.
constexpr double kF32Tol = 1e-5;

Tensor leaf(const Shape& s, double lo = -3, double hi = 3) {
  return uniform(s, lo, hi, TensorOptions(DType::f64)).set_requires_grad(true);
}
Tensor composed(const Tensor& g, const Tensor& u) { return mul(gelu(g, /*approximate=*/true), u); }
Tensor f64(const Tensor& t) { return to_dtype(t, DType::f64); }
bool all_finite(const Tensor& t) {
  for (double v : f64(t).to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}
}  // namespace

TEST_CASE("geglu forward equals gelu_tanh(gate) * up", "[geglu]") {
  manual_seed(21);
  // 70000 elements: above cpu::kParallelGrain (parallel blocks) and not a multiple of the block.
  for (const Shape& s : {Shape{3, 5}, Shape{7, 10000}, Shape{0, 4}}) {
    Tensor g = uniform(s, -8, 8, TensorOptions(DType::f64)), u = uniform(s, -2, 2, TensorOptions(DType::f64));
    const Tensor ref = composed(g, u);
    CHECK(max_abs_diff(geglu(g, u), ref) < kF64Tol);
    Tensor y = geglu(to_dtype(g, DType::f32), to_dtype(u, DType::f32));
    CHECK(y.dtype() == DType::f32);
    CHECK(max_abs_diff(f64(y), ref) < kF32Tol);
  }
  // hand-computed: gelu_tanh(0) = 0, gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715))
  auto v = geglu(from_vector<double>({0, 1}, {2}), from_vector<double>({5, 2}, {2})).to_vector<double>();
  CHECK(v[0] == 0.0);
  CHECK(v[1] == Approx(2.0 * 0.5 * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * 1.044715))).epsilon(1e-13));
  // bf16 in, bf16 out (upcast by the dispatcher), within bf16 rounding of the f64 value
  Tensor g = uniform({4, 8}, -3, 3, TensorOptions(DType::f64)), u = uniform({4, 8}, -1, 1, TensorOptions(DType::f64));
  Tensor yb = geglu(to_dtype(g, DType::bf16), to_dtype(u, DType::bf16));
  CHECK(yb.dtype() == DType::bf16);
  CHECK(max_abs_diff(f64(yb), composed(g, u)) < 0.05);
}

TEST_CASE("geglu on strided inputs", "[geglu]") {
  manual_seed(22);
  Tensor g = uniform({6, 4}, -3, 3, TensorOptions(DType::f32)), u = uniform({4, 6}, -3, 3, TensorOptions(DType::f32));
  Tensor gt = g.transpose(0, 1);  // [4, 6], non-contiguous
  CHECK_FALSE(gt.is_contiguous());
  CHECK(max_abs_diff(geglu(gt, u), geglu(gt.contiguous(), u)) == 0.0);
  auto d = dispatch(OpCall{op_def("geglu_backward"), {u, gt, u}, {}});
  auto e = dispatch(OpCall{op_def("geglu_backward"), {u, gt.contiguous(), u}, {}});
  CHECK(max_abs_diff(d[0], e[0]) == 0.0);
  CHECK(max_abs_diff(d[1], e[1]) == 0.0);
  // the two halves of a joined [.., 2I] tensor read in place (rows of 37, packet tails in every
  // row) equal the contiguous path
  Tensor x = uniform({9, 74}, -5, 5, TensorOptions(DType::f32));
  CHECK(max_abs_diff(geglu(x.narrow(1, 0, 37), x.narrow(1, 37, 37)),
                     geglu(x.narrow(1, 0, 37).contiguous(), x.narrow(1, 37, 37).contiguous())) == 0.0);
}

TEST_CASE("geglu backward matches finite differences", "[geglu][grad]") {
  manual_seed(23);
  auto f = [](const std::vector<Tensor>& v) { return geglu(v[0], v[1]); };
  CHECK(gradcheck(f, {leaf({3, 7}), leaf({3, 7})}) == "");
  CHECK(gradcheck(f, {leaf({2, 3, 4}, -8, 8), leaf({2, 3, 4})}) == "");
  // only one input requires grad
  Tensor up = uniform({5}, -1, 1, TensorOptions(DType::f64));
  CHECK(gradcheck([up](const std::vector<Tensor>& v) { return geglu(v[0], up); }, {leaf({5})}) == "");
  Tensor gate = uniform({5}, -1, 1, TensorOptions(DType::f64));
  CHECK(gradcheck([gate](const std::vector<Tensor>& v) { return geglu(gate, v[0]); }, {leaf({5})}) == "");
}

TEST_CASE("geglu gradients equal the composition's", "[geglu][grad]") {
  manual_seed(24);
  const Shape s{9, 4000};
  Tensor g0 = uniform(s, -6, 6, TensorOptions(DType::f64)), u0 = uniform(s, -2, 2, TensorOptions(DType::f64));
  Tensor w = normal(s, 0.0, 1.0, TensorOptions(DType::f64));
  Tensor g2 = g0.clone().set_requires_grad(true), u2 = u0.clone().set_requires_grad(true);
  sum(mul(composed(g2, u2), w)).backward();  // the f64 reference
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(dt);
    const double tol = dt == DType::f64 ? kF64Tol : 2e-5;  // f32: gradients ~10, a few ulps
    Tensor g1 = to_dtype(g0, dt).set_requires_grad(true), u1 = to_dtype(u0, dt).set_requires_grad(true);
    sum(mul(geglu(g1, u1), to_dtype(w, dt))).backward();
    CHECK(max_abs_diff(f64(g1.grad()), g2.grad()) < tol);
    CHECK(max_abs_diff(f64(u1.grad()), u2.grad()) < tol);
  }
}

TEST_CASE("geglu at large |gate| stays finite", "[geglu]") {
  // exp(-v) overflows (f32 beyond 88.7) for gate = -60 (v = 2u ~ -15500): s -> 0, gelu -> 0.
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor g = to_dtype(from_vector<double>({-60, -5, 5, 60, -1e4, 1e4}, {6}), dt).set_requires_grad(true);
    Tensor u = to_dtype(from_vector<double>({2, 2, 2, 2, -1, -1}, {6}), dt).set_requires_grad(true);
    Tensor y = geglu(g, u);
    INFO(dt);
    CHECK(all_finite(y));
    auto v = f64(y).to_vector<double>();
    CHECK(std::abs(v[0]) < 1e-30);
    CHECK(v[2] == Approx(10.0).epsilon(1e-6));
    CHECK(v[3] == Approx(120.0).epsilon(1e-6));
    CHECK(v[5] == Approx(-1e4).epsilon(1e-6));
    sum(y).backward();
    CHECK(all_finite(g.grad()));
    CHECK(all_finite(u.grad()));
    auto dg = f64(g.grad()).to_vector<double>();
    CHECK(dg[3] == Approx(2.0).epsilon(1e-6));  // d/dx gelu -> 1 for large x
    CHECK(std::abs(dg[0]) < 1e-30);             // -> 0 for very negative x
    // Eigen's f32 exp saturates near FLT_MAX instead of inf: s ~ 3e-39, times |x * v'| ~ 2e11
    CHECK(std::abs(dg[4]) < 1e-20);
  }
}

TEST_CASE("geglu rejects mismatched inputs", "[geglu]") {
  CHECK_THROWS_WITH(geglu(zeros({2, 3}), zeros({3, 2})), Catch::Contains("geglu") && Catch::Contains("[2, 3]") &&
                                                             Catch::Contains("same shape"));
  CHECK_THROWS_WITH(geglu(zeros({2}), zeros({2}, TensorOptions(DType::f64))),
                    Catch::Contains("geglu: dtype mismatch") && Catch::Contains("float64"));
  CHECK_THROWS_WITH(geglu(zeros({2}, TensorOptions(DType::i64)), zeros({2}, TensorOptions(DType::i64))),
                    Catch::Contains("floating"));
}
