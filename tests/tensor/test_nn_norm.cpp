// rms_norm: hand-checked forward, low-precision path, backward (dx and dweight) against
// finite differences including non-contiguous input and size-1 / empty dims.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;

namespace {
Tensor leaf(const Shape& s, double lo = -1.5, double hi = 1.5) {
  return uniform(s, lo, hi, TensorOptions(DType::f64)).set_requires_grad(true);
}
}  // namespace

TEST_CASE("rms_norm forward hand-checked", "[rms_norm]") {
  Tensor x = from_vector<double>({3, 4, 0, 0}, {2, 2});
  Tensor w = from_vector<double>({1, 2}, {2});
  auto y = rms_norm(x, w, 0.0).to_vector<double>();
  const double r = 1 / std::sqrt((9.0 + 16.0) / 2);
  CHECK(y[0] == Approx(3 * r));
  CHECK(y[1] == Approx(8 * r));
  auto z = rms_norm(x, w, 1e-6).to_vector<double>();
  CHECK(z[2] == 0.0);  // zero row stays finite with eps
  CHECK(z[3] == 0.0);
  // bf16 input computes in f32 and returns bf16
  Tensor xb = to_dtype(x, DType::bf16), wb = to_dtype(w, DType::bf16);
  Tensor yb = rms_norm(xb, wb, 1e-6);
  CHECK(yb.dtype() == DType::bf16);
  CHECK(yb.to_vector<double>()[1] == Approx(8 * r).epsilon(1e-2));
}

TEST_CASE("rms_norm errors", "[rms_norm]") {
  CHECK_THROWS_WITH(rms_norm(zeros({2, 4}), zeros({3}), 1e-6), Catch::Contains("rms_norm") && Catch::Contains("[3]"));
  CHECK_THROWS_WITH(rms_norm(zeros({2, 4}), zeros({4}, DType::f64), 1e-6), Catch::Contains("dtype"));
}

TEST_CASE("rms_norm backward matches finite differences", "[rms_norm][grad]") {
  manual_seed(21);
  auto f = [](const std::vector<Tensor>& v) { return rms_norm(v[0], v[1], 1e-5); };
  CHECK(gradcheck(f, {leaf({3, 6}), leaf({6})}) == "");
  CHECK(gradcheck(f, {leaf({2, 3, 5}), leaf({5})}) == "");
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return rms_norm(v[0].transpose(0, 1), v[1], 1e-5); },
                  {leaf({4, 3, 5}), leaf({5})}) == "");
  CHECK(gradcheck(f, {leaf({4, 1}), leaf({1})}) == "");
  CHECK(gradcheck(f, {leaf({0, 4}), leaf({4})}) == "");
  // only x requires grad
  Tensor w = uniform({5}, 0.5, 1.5, TensorOptions(DType::f64));
  CHECK(gradcheck([w](const std::vector<Tensor>& v) { return rms_norm(v[0], w, 1e-6); }, {leaf({3, 5})}) == "");
}

TEST_CASE("rms_norm equals the composite formula on many rows", "[rms_norm]") {
  manual_seed(4);
  Tensor x = randn({64, 96, 40}, DType::f64), w = randn({40}, DType::f64);  // large: parallel path
  Tensor ref = mul(mul(x, rsqrt(add(mean(mul(x, x), {-1}, true), 1e-6))), w);
  CHECK(dtr::testing::max_abs_diff(rms_norm(x, w, 1e-6), ref) < 1e-12);
  Tensor xl = x.clone().set_requires_grad(true), wl = w.clone().set_requires_grad(true);
  Tensor g = randn({64, 96, 40}, DType::f64);
  sum(mul(rms_norm(xl, wl, 1e-6), g)).backward();
  Tensor xr = x.clone().set_requires_grad(true), wr = w.clone().set_requires_grad(true);
  sum(mul(mul(mul(xr, rsqrt(add(mean(mul(xr, xr), {-1}, true), 1e-6))), wr), g)).backward();
  CHECK(dtr::testing::max_abs_diff(xl.grad(), xr.grad()) < 1e-10);
  CHECK(dtr::testing::max_abs_diff(wl.grad(), wr.grad()) < 1e-9);
}
