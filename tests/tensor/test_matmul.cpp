// Matrix products: mm / bmm / matmul / linear / addmm_ against a naive triple loop (contiguous and
// transposed operands, batch broadcasting, 1-D cases, k = 0), backward against finite
// differences in f64, and shape errors.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {
/// f32 GEMM vs a double-accumulated reference: k <= 64 terms of size <= 1, so the f32 sum
/// order error stays below k * 2^-24 * max|term| ~ 4e-6.
constexpr double kF32Tol = 1e-5;
constexpr double kF64Tol = 1e-12;

Tensor rnd(const Shape& s, DType dt = DType::f32) { return uniform(s, -1.0, 1.0, TensorOptions(dt)); }
Tensor leaf(const Shape& s) { return rnd(s, DType::f64).set_requires_grad(true); }

/// Reference [.., m, k] x [.., k, n] for 2-d or 3-d (equal batch) operands, in double.
Tensor naive_bmm(const Tensor& a, const Tensor& b) {
  const bool batched = a.dim() == 3;
  Tensor A = batched ? a : a.unsqueeze(0), B = batched ? b : b.unsqueeze(0);
  const int64_t nb = A.size(0), m = A.size(1), k = A.size(2), n = B.size(2);
  auto av = A.to_vector<double>(), bv = B.to_vector<double>();
  std::vector<double> out(static_cast<size_t>(nb * m * n), 0.0);
  for (int64_t p = 0; p < nb; ++p)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < k; ++q) s += av[(p * m + i) * k + q] * bv[(p * k + q) * n + j];
        out[(p * m + i) * n + j] = s;
      }
  Tensor r = from_vector<double>(out, {nb, m, n});
  return batched ? r : r.squeeze(0);
}
}  // namespace

TEST_CASE("mm matches the triple loop, contiguous and transposed", "[matmul]") {
  manual_seed(31);
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f32 ? kF32Tol : kF64Tol;
    Tensor a = rnd({7, 5}, dt), b = rnd({5, 9}, dt);
    CHECK(max_abs_diff(mm(a, b).to(DType::f64), naive_bmm(a, b)) < tol);
    Tensor at = rnd({5, 7}, dt).t(), bt = rnd({9, 5}, dt).t();  // non-contiguous operands
    REQUIRE_FALSE(at.is_contiguous());
    CHECK(max_abs_diff(mm(at, bt).to(DType::f64), naive_bmm(at, bt)) < tol);
    CHECK(max_abs_diff(mm(at, b).to(DType::f64), naive_bmm(at, b)) < tol);
    Tensor big_a = rnd({64, 48}, dt), big_b = rnd({48, 33}, dt);
    CHECK(max_abs_diff(mm(big_a, big_b).to(DType::f64), naive_bmm(big_a, big_b)) < tol);
    // A column slice: strided rows.
    Tensor as = rnd({7, 12}, dt).narrow(1, 3, 5);
    CHECK(max_abs_diff(mm(as, b).to(DType::f64), naive_bmm(as, b)) < tol);
  }
}

TEST_CASE("bmm and matmul with batch broadcasting and 1-d operands", "[matmul]") {
  manual_seed(32);
  Tensor a = rnd({3, 4, 5}), b = rnd({3, 5, 2});
  CHECK(max_abs_diff(bmm(a, b).to(DType::f64), naive_bmm(a, b)) < kF32Tol);
  Tensor bt = rnd({3, 2, 5}).transpose(1, 2);
  CHECK(max_abs_diff(bmm(a, bt).to(DType::f64), naive_bmm(a, bt)) < kF32Tol);
  SECTION("broadcast batch dims") {
    Tensor x = rnd({2, 1, 4, 5}), y = rnd({3, 5, 6});
    Tensor z = matmul(x, y);
    REQUIRE(z.sizes() == Shape{2, 3, 4, 6});
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        Tensor ref = naive_bmm(x.narrow(0, i, 1).squeeze(0).squeeze(0), y.narrow(0, j, 1).squeeze(0));
        CHECK(max_abs_diff(z.narrow(0, i, 1).narrow(1, j, 1).reshape({4, 6}).to(DType::f64), ref) < kF32Tol);
      }
  }
  SECTION("[..., m, k] x [k, n]") {
    Tensor x = rnd({2, 3, 4}), w = rnd({4, 5});
    Tensor z = matmul(x, w);
    REQUIRE(z.sizes() == Shape{2, 3, 5});
    CHECK(max_abs_diff(z.reshape({6, 5}).to(DType::f64), naive_bmm(x.reshape({6, 4}), w)) < kF32Tol);
  }
  SECTION("1-d cases") {
    Tensor v = rnd({4}), m = rnd({4, 3}), m2 = rnd({3, 4});
    Tensor vm = matmul(v, m);
    REQUIRE(vm.sizes() == Shape{3});
    CHECK(max_abs_diff(vm.to(DType::f64), naive_bmm(v.unsqueeze(0), m).squeeze(0)) < kF32Tol);
    Tensor mv = matmul(m2, v);
    REQUIRE(mv.sizes() == Shape{3});
    CHECK(max_abs_diff(mv.to(DType::f64), naive_bmm(m2, v.unsqueeze(1)).squeeze(1)) < kF32Tol);
    Tensor dot = matmul(v, v);
    CHECK(dot.dim() == 0);
    double s = 0;
    for (float e : v.to_vector<float>()) s += static_cast<double>(e) * e;
    CHECK(dot.item<double>() == Approx(s).epsilon(1e-6));
    Tensor bv = matmul(rnd({2, 3, 4}), v);
    CHECK(bv.sizes() == Shape{2, 3});
  }
}

TEST_CASE("empty dims: k = 0 gives zeros, m = 0 gives empty", "[matmul]") {
  Tensor a = zeros({3, 0}), b = zeros({0, 4});
  Tensor c = mm(a, b);
  REQUIRE(c.sizes() == Shape{3, 4});
  CHECK(c.to_vector<float>() == std::vector<float>(12, 0.0f));
  CHECK(mm(zeros({0, 5}), rnd({5, 2})).sizes() == Shape{0, 2});
  CHECK(bmm(zeros({2, 3, 0}), zeros({2, 0, 4})).to_vector<float>() == std::vector<float>(24, 0.0f));
  CHECK(linear(zeros({2, 0}), zeros({3, 0}), ones({3})).to_vector<float>() == std::vector<float>(6, 1.0f));
}

TEST_CASE("linear equals x W^T + b", "[matmul]") {
  manual_seed(33);
  Tensor x = rnd({2, 3, 5}), w = rnd({4, 5}), b = rnd({4});
  Tensor y = linear(x, w, b);
  REQUIRE(y.sizes() == Shape{2, 3, 4});
  Tensor ref = add(naive_bmm(x.reshape({6, 5}), w.t()), b.to(DType::f64));
  CHECK(max_abs_diff(y.reshape({6, 4}).to(DType::f64), ref) < kF32Tol);
  CHECK(max_abs_diff(linear(x, w).reshape({6, 4}).to(DType::f64), naive_bmm(x.reshape({6, 5}), w.t())) < kF32Tol);
}

TEST_CASE("matrix products backward matches finite differences (f64)", "[matmul][grad]") {
  manual_seed(34);
  using V = std::vector<Tensor>;
  CHECK(gradcheck([](const V& v) { return mm(v[0], v[1]); }, {leaf({3, 4}), leaf({4, 2})}) == "");
  CHECK(gradcheck([](const V& v) { return mm(v[0].t(), v[1].t()); }, {leaf({4, 3}), leaf({2, 4})}) == "");
  CHECK(gradcheck([](const V& v) { return bmm(v[0], v[1]); }, {leaf({2, 3, 4}), leaf({2, 4, 2})}) == "");
  CHECK(gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({2, 1, 3, 4}), leaf({3, 4, 2})}) == "");
  CHECK(gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({4}), leaf({4, 3})}) == "");
  CHECK(gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({3, 4}), leaf({4})}) == "");
  CHECK(gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({4}), leaf({4})}) == "");
  CHECK(gradcheck([](const V& v) { return matmul(v[0], v[1]); }, {leaf({2, 3, 4}), leaf({4, 5})}) == "");
  CHECK(gradcheck([](const V& v) { return linear(v[0], v[1], v[2]); }, {leaf({2, 3, 4}), leaf({5, 4}), leaf({5})}) ==
        "");
}

TEST_CASE("mm gradients keep their operand's layout (weights used as w.t() get contiguous grads)",
          "[matmul][grad]") {
  manual_seed(35);
  // linear: y = x w^T with w [out, in]; dw = g^T x, dx = g w. The transposed operands of the
  // second case are column-major views, whose gradients are formed transposed.
  Tensor x = leaf({6, 4}), w = leaf({3, 4});
  Tensor g = rnd({6, 3}, DType::f64);
  linear(x, w, Tensor()).backward(g);
  CHECK(w.grad().is_contiguous());
  CHECK(x.grad().is_contiguous());
  CHECK(max_abs_diff(w.grad(), naive_bmm(g.t(), x.detach())) < kF64Tol);
  CHECK(max_abs_diff(x.grad(), naive_bmm(g, w.detach())) < kF64Tol);

  Tensor at = leaf({4, 6}), bt = leaf({3, 4});  // mm(at.t(), bt.t()): both column-major
  mm(at.t(), bt.t()).backward(g);
  CHECK(at.grad().is_contiguous());
  CHECK(bt.grad().is_contiguous());
  CHECK(max_abs_diff(at.grad(), naive_bmm(bt.detach().t(), g.t())) < kF64Tol);  // (g b^T)^T
  CHECK(max_abs_diff(bt.grad(), naive_bmm(g.t(), at.detach().t())) < kF64Tol);  // (a^T g)^T
}

TEST_CASE("addmm_ adds a x b into self in place (contiguous and strided self, transposed operands)",
          "[matmul][addmm]") {
  manual_seed(35);
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f32 ? kF32Tol : kF64Tol;
    // 40 x 37 += [64 x 40]^T x 64 x 37: the SGEMM's packed path with a column-major A (the fused
    // head's dweight += dlogits^T x layout), k over one block; and a row-major A / column-major B.
    Tensor c0 = rnd({40, 37}, dt), at = rnd({64, 40}, dt).t(), b = rnd({64, 37}, dt);
    Tensor c = c0.clone();
    Tensor& r = addmm_(c, at, b);
    CHECK(&r == &c);
    CHECK(max_abs_diff(c.to(DType::f64), add(c0.to(DType::f64), naive_bmm(at, b))) < tol);
    Tensor a = rnd({40, 64}, dt), bt = rnd({37, 64}, dt).t();
    addmm_(c, a, bt);
    CHECK(max_abs_diff(c.to(DType::f64), add(add(c0.to(DType::f64), naive_bmm(at, b)), naive_bmm(a, bt))) < 2 * tol);
    // A strided self (a column slice): product, then an elementwise add; the rest untouched.
    Tensor big = rnd({40, 50}, dt), before = big.clone();
    Tensor view = big.narrow(1, 5, 37);
    REQUIRE_FALSE(view.is_contiguous());
    addmm_(view, at, b);
    CHECK(max_abs_diff(big.narrow(1, 5, 37).to(DType::f64), add(before.narrow(1, 5, 37).to(DType::f64),
                                                                naive_bmm(at, b))) < tol);
    CHECK(max_abs_diff(big.narrow(1, 0, 5), before.narrow(1, 0, 5)) == 0.0);
    CHECK(max_abs_diff(big.narrow(1, 42, 8), before.narrow(1, 42, 8)) == 0.0);
    // k = 0 leaves self unchanged.
    Tensor e = c0.clone();
    addmm_(e, zeros({40, 0}, dt), zeros({0, 37}, dt));
    CHECK(max_abs_diff(e, c0) == 0.0);
  }
}

TEST_CASE("addmm_ rejects bad operands", "[matmul][addmm]") {
  Tensor c = zeros({2, 4});
  CHECK_THROWS_WITH(addmm_(c, zeros({2, 3}), zeros({2, 4})), Catch::Contains("addmm_") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(addmm_(c, zeros({3, 3}), zeros({3, 4})), Catch::Contains("do not match"));
  CHECK_THROWS_WITH(addmm_(c, zeros({2, 3, 1}), zeros({3, 4})), Catch::Contains("2-d"));
  CHECK_THROWS(addmm_(c, zeros({2, 3}, DType::f64), zeros({3, 4}, DType::f64)));
  Tensor i = zeros({2, 4}, DType::i64);
  CHECK_THROWS_WITH(addmm_(i, zeros({2, 3}, DType::i64), zeros({3, 4}, DType::i64)), Catch::Contains("dtype"));
  CHECK_THROWS_WITH(addmm_(c, zeros({2, 3}).set_requires_grad(true), zeros({3, 4})), Catch::Contains("requires grad"));
  Tensor leaf_c = zeros({2, 4}).set_requires_grad(true);
  CHECK_THROWS_WITH(addmm_(leaf_c, zeros({2, 3}), zeros({3, 4})), Catch::Contains("requires grad"));
  Tensor sq = zeros({4, 4});
  CHECK_THROWS_WITH(addmm_(sq, sq.t(), zeros({4, 4})), Catch::Contains("shares storage"));
}

TEST_CASE("matrix products reject mismatched shapes", "[matmul]") {
  CHECK_THROWS_WITH(mm(zeros({2, 3}), zeros({4, 5})), Catch::Contains("mm") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(mm(zeros({2, 3, 1}), zeros({3, 5})), Catch::Contains("2-d"));
  CHECK_THROWS_WITH(bmm(zeros({2, 3, 4}), zeros({3, 4, 5})), Catch::Contains("bmm"));
  CHECK_THROWS_WITH(matmul(zeros({2, 3}), zeros({4})), Catch::Contains("matmul"));
  CHECK_THROWS_WITH(matmul(zeros({2, 2, 3}), zeros({3, 3, 4})), Catch::Contains("matmul"));
  CHECK_THROWS_WITH(linear(zeros({2, 3}), zeros({4, 5})), Catch::Contains("linear"));
  CHECK_THROWS_WITH(linear(zeros({2, 3}), zeros({4, 3}), zeros({5})), Catch::Contains("bias"));
  CHECK_THROWS(mm(zeros({2, 3}), zeros({3, 4}, DType::f64)));
}
