// softmax / log_softmax: hand-checked values, stability on large inputs, any dim, and backward
// against finite differences (non-contiguous inputs, size-1 and empty dims).
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;

namespace {
Tensor leaf(const Shape& s, double lo = -2.0, double hi = 2.0) {
  return uniform(s, lo, hi, TensorOptions(DType::f64)).set_requires_grad(true);
}
auto U(int64_t dim, bool log) {
  return [dim, log](const std::vector<Tensor>& v) { return log ? log_softmax(v[0], dim) : softmax(v[0], dim); };
}
}  // namespace

TEST_CASE("softmax forward hand-checked", "[softmax]") {
  Tensor x = from_vector<double>({0.0, 1.0, 2.0, 1000.0, 1000.0, 1000.0}, {2, 3});
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  auto y = softmax(x, -1).to_vector<double>();
  CHECK(y[0] == Approx(1 / z));
  CHECK(y[2] == Approx(std::exp(2.0) / z));
  CHECK(y[4] == Approx(1.0 / 3));  // no overflow at 1000
  auto ly = log_softmax(x, 1).to_vector<double>();
  CHECK(ly[1] == Approx(1.0 - std::log(z)));
  CHECK(ly[5] == Approx(-std::log(3.0)));
  // dim 0: columns
  auto y0 = softmax(x, 0).to_vector<double>();
  CHECK(y0[0] == Approx(0.0).margin(1e-300));
  CHECK(y0[3] == Approx(1.0));
  // f32, -inf entries (masked attention row)
  const float ninf = -std::numeric_limits<float>::infinity();
  auto m = softmax(from_vector<float>({0.f, ninf, 0.f}, {3}), 0).to_vector<float>();
  CHECK(m == std::vector<float>{0.5f, 0.f, 0.5f});
}

TEST_CASE("softmax matches exp(log_softmax) over every dim", "[softmax]") {
  manual_seed(3);
  Tensor x = randn({2, 3, 4}, DType::f64);
  for (int64_t d = 0; d < 3; ++d) {
    CHECK(dtr::testing::max_abs_diff(softmax(x, d), exp(log_softmax(x, d))) < 1e-12);
    CHECK(dtr::testing::max_abs_diff(sum(softmax(x, d), {d}), ones({2, 3, 4}, DType::f64).narrow(d, 0, 1).squeeze(d)) <
          1e-12);
  }
  // a transposed view gives the same result as its contiguous copy
  Tensor xt = x.transpose(0, 2);
  CHECK(dtr::testing::max_abs_diff(softmax(xt, 1), softmax(contiguous(xt), 1)) == 0.0);
}

TEST_CASE("softmax backward matches finite differences", "[softmax][grad]") {
  manual_seed(11);
  for (bool log : {false, true}) {
    CHECK(gradcheck(U(-1, log), {leaf({3, 5})}) == "");
    CHECK(gradcheck(U(0, log), {leaf({3, 5})}) == "");
    CHECK(gradcheck(U(1, log), {leaf({2, 3, 4})}) == "");
    CHECK(gradcheck([log](const std::vector<Tensor>& v) { return log ? log_softmax(v[0].t(), 1) : softmax(v[0].t(), 1); },
                    {leaf({4, 3})}) == "");
    CHECK(gradcheck(U(1, log), {leaf({3, 1})}) == "");
    CHECK(gradcheck(U(1, log), {leaf({0, 4})}) == "");
  }
}

TEST_CASE("softmax errors", "[softmax]") {
  CHECK_THROWS_WITH(softmax(zeros({2, 3}), 2), Catch::Contains("softmax"));
  CHECK_THROWS_WITH(softmax(zeros({2}, DType::i64), 0), Catch::Contains("floating"));
}

TEST_CASE("softmax equals the composite formula on large inputs", "[softmax]") {
  manual_seed(5);
  Tensor x = mul(randn({40, 50, 30}, DType::f64), 5.0);  // parallel path, inner > 1 for dim 1
  for (int64_t d : {1, 2}) {
    Tensor e = exp(sub(x, amax(x, {d}, true)));
    CHECK(dtr::testing::max_abs_diff(softmax(x, d), div(e, sum(e, {d}, true))) < 1e-14);
    CHECK(dtr::testing::max_abs_diff(log_softmax(x, d), log(div(e, sum(e, {d}, true)))) < 1e-12);
  }
}
