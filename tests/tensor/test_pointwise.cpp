// Pointwise ops: forward values on hand-checked cases, backward against finite differences
// (broadcasting, non-contiguous inputs, size-1 and empty dims).
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;

namespace {
Tensor leaf(const Shape& s, double lo = -1.0, double hi = 1.0) {
  return uniform(s, lo, hi, TensorOptions(DType::f64)).set_requires_grad(true);
}
}  // namespace

TEST_CASE("binary ops broadcast forward", "[pointwise]") {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({10, 20, 30}, {3});
  CHECK(add(a, b).to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  CHECK(sub(b, a).to_vector<float>() == std::vector<float>{9, 18, 27, 6, 15, 24});
  Tensor col = from_vector<float>({2, 3}, {2, 1});
  CHECK(mul(a, col).to_vector<float>() == std::vector<float>{2, 4, 6, 12, 15, 18});
  CHECK(div(a, col).to_vector<float>()[3] == Approx(4.0f / 3.0f));
  CHECK((a * 2.0).to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
  CHECK(rsub(a, 1.0).to_vector<float>()[0] == 0.0f);
}

TEST_CASE("binary ops errors", "[pointwise]") {
  Tensor a = zeros({2, 3});
  CHECK_THROWS_WITH(add(a, zeros({4})), Catch::Contains("add") && Catch::Contains("[2, 3]") && Catch::Contains("[4]"));
  CHECK_THROWS_WITH(mul(a, zeros({2, 3}, DType::f64)), Catch::Contains("dtype mismatch"));
}

TEST_CASE("unary ops forward", "[pointwise]") {
  Tensor x = from_vector<double>({-2.0, -0.5, 0.0, 0.7, 3.0}, {5});
  auto v = silu(x).to_vector<double>();
  CHECK(v[0] == Approx(-2.0 / (1 + std::exp(2.0))));
  auto g = gelu(x).to_vector<double>();
  CHECK(g[3] == Approx(0.5 * 0.7 * (1 + std::erf(0.7 / std::sqrt(2.0)))));
  CHECK(sigmoid(x).to_vector<double>()[2] == Approx(0.5));
  CHECK(relu(x).to_vector<double>() == std::vector<double>{0, 0, 0, 0.7, 3.0});
}

TEST_CASE("pointwise backward matches finite differences", "[pointwise][grad]") {
  manual_seed(7);
  auto B = [](auto fn) { return [fn](const std::vector<Tensor>& v) { return fn(v[0], v[1]); }; };
  auto U = [](auto fn) { return [fn](const std::vector<Tensor>& v) { return fn(v[0]); }; };
  SECTION("add/sub/mul/div with broadcasting") {
    CHECK(gradcheck(B([](auto a, auto b) { return add(a, b); }), {leaf({2, 3}), leaf({3})}) == "");
    CHECK(gradcheck(B([](auto a, auto b) { return sub(a, b); }), {leaf({2, 1, 3}), leaf({4, 1})}) == "");
    CHECK(gradcheck(B([](auto a, auto b) { return mul(a, b); }), {leaf({1, 3}), leaf({2, 1})}) == "");
    CHECK(gradcheck(B([](auto a, auto b) { return div(a, b); }), {leaf({2, 3}), leaf({2, 3}, 0.5, 2.0)}) == "");
    CHECK(gradcheck(B([](auto a, auto b) { return maximum(a, b); }), {leaf({3, 4}), leaf({4})}) == "");
  }
  SECTION("non-contiguous inputs") {
    Tensor a = leaf({3, 4}), b = leaf({4, 3});
    CHECK(gradcheck([](const std::vector<Tensor>& v) { return mul(v[0].t(), v[1]); }, {a, b}) == "");
    CHECK(gradcheck([](const std::vector<Tensor>& v) { return exp(v[0].t()); }, {a}) == "");
  }
  SECTION("size-1 and empty dims") {
    CHECK(gradcheck(B([](auto a, auto b) { return mul(a, b); }), {leaf({1, 1}), leaf({3, 1})}) == "");
    CHECK(gradcheck(B([](auto a, auto b) { return add(a, b); }), {leaf({0, 3}), leaf({3})}) == "");
  }
  SECTION("scalar variants") {
    CHECK(gradcheck(U([](auto a) { return add(mul(a, 3.0), 1.5); }), {leaf({4})}) == "");
    CHECK(gradcheck(U([](auto a) { return rsub(div(a, 2.0), 1.0); }), {leaf({4})}) == "");
    CHECK(gradcheck(U([](auto a) { return pow(a, 3.0); }), {leaf({5}, 0.2, 2.0)}) == "");
  }
  SECTION("unary") {
    CHECK(gradcheck(U([](auto a) { return exp(a); }), {leaf({5})}) == "");
    CHECK(gradcheck(U([](auto a) { return log(a); }), {leaf({5}, 0.5, 2.0)}) == "");
    CHECK(gradcheck(U([](auto a) { return sqrt(a); }), {leaf({5}, 0.5, 2.0)}) == "");
    CHECK(gradcheck(U([](auto a) { return rsqrt(a); }), {leaf({5}, 0.5, 2.0)}) == "");
    CHECK(gradcheck(U([](auto a) { return abs(a); }), {leaf({5}, 0.1, 1.0)}) == "");
    CHECK(gradcheck(U([](auto a) { return silu(a); }), {leaf({5}, -3, 3)}) == "");
    CHECK(gradcheck(U([](auto a) { return gelu(a); }), {leaf({5}, -3, 3)}) == "");
    CHECK(gradcheck(U([](auto a) { return gelu(a, true); }), {leaf({5}, -3, 3)}) == "");
    CHECK(gradcheck(U([](auto a) { return sigmoid(a); }), {leaf({5}, -3, 3)}) == "");
    CHECK(gradcheck(U([](auto a) { return tanh(a); }), {leaf({5}, -3, 3)}) == "");
    CHECK(gradcheck(U([](auto a) { return neg(a); }), {leaf({5})}) == "");
  }
  SECTION("where / masked_fill") {
    Tensor cond = gt(uniform({3, 4}, -1, 1, TensorOptions(DType::f64)), 0.0);
    CHECK(gradcheck([cond](const std::vector<Tensor>& v) { return where(cond, v[0], v[1]); }, {leaf({3, 4}), leaf({4})}) ==
          "");
    CHECK(gradcheck([cond](const std::vector<Tensor>& v) { return masked_fill(v[0], cond, -5.0); }, {leaf({3, 4})}) == "");
  }
}

TEST_CASE("bf16 and f16 compute in f32 and round back", "[pointwise][dtype]") {
  Tensor a = from_vector<float>({1.0f, 2.5f, -3.0f}, {3}).to(DType::bf16);
  Tensor b = from_vector<float>({0.5f, 0.25f, 4.0f}, {3}).to(DType::bf16);
  Tensor c = add(a, b);
  CHECK(c.dtype() == DType::bf16);
  CHECK(c.to_vector<float>() == std::vector<float>{1.5f, 2.75f, 1.0f});
  Tensor h = mul(a.to(DType::f16), b.to(DType::f16));
  CHECK(h.dtype() == DType::f16);
  CHECK(h.to_vector<float>() == std::vector<float>{0.5f, 0.625f, -12.0f});
}
