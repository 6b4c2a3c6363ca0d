// Views: aliasing, shared version counter, contiguous() copies only when needed, reshape vs
// view on non-contiguous tensors, and values + finite-difference backward of every view op.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;

namespace {
Tensor iota(const Shape& s, DType dt = DType::f64) { return arange(0, static_cast<double>(shape_numel(s)), 1, dt).reshape(s); }
Tensor leaf(const Shape& s) { return uniform(s, -1.0, 1.0, TensorOptions(DType::f64)).set_requires_grad(true); }
using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;
}  // namespace

TEST_CASE("views alias storage and share the version counter", "[views]") {
  Tensor x = iota({3, 4});
  Tensor v = x.view({4, 3});
  Tensor t = x.t();
  Tensor n = x.narrow(1, 1, 2);
  CHECK(v.storage().get() == x.storage().get());
  CHECK(t.storage().get() == x.storage().get());
  v.fill_(0.0);
  CHECK(sum(x).item<double>() == 0.0);
  n.copy_(full({3, 2}, 5.0, DType::f64));
  CHECK(x.to_vector<double>() == std::vector<double>{0, 5, 5, 0, 0, 5, 5, 0, 0, 5, 5, 0});
  CHECK(t.to_vector<double>()[4] == 5.0);  // t[1][1] = x[1][1]
  const uint32_t v0 = x.version();
  Tensor e = x.unsqueeze(0).expand({2, 3, 4});
  mul_(n, 2.0);
  CHECK(x.version() == v0 + 1);
  CHECK(v.version() == x.version());
  CHECK(e.version() == x.version());
  CHECK(x.to_vector<double>()[1] == 10.0);
}

TEST_CASE("contiguous copies only when needed", "[views]") {
  Tensor x = iota({3, 4});
  CHECK(x.is_contiguous());
  CHECK(x.contiguous().is_same(x));
  Tensor t = x.t();
  CHECK_FALSE(t.is_contiguous());
  Tensor c = t.contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.storage().get() != x.storage().get());
  CHECK(c.to_vector<double>() == t.to_vector<double>());
  CHECK(c.to_vector<double>() == std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  // A narrow along dim 0 keeps contiguity; along dim 1 it does not.
  CHECK(x.narrow(0, 1, 2).is_contiguous());
  CHECK_FALSE(x.narrow(1, 1, 2).is_contiguous());
}

TEST_CASE("reshape of a transposed tensor copies; view of it raises", "[views]") {
  Tensor x = iota({3, 4});
  Tensor t = x.t();
  Tensor r = t.reshape({12});
  CHECK(r.storage().get() != x.storage().get());
  CHECK(r.to_vector<double>() == std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  CHECK_THROWS_WITH(t.view({12}), Catch::Contains("view") && Catch::Contains("[4, 3]"));
  // reshape of a contiguous tensor is a view.
  CHECK(x.reshape({2, 6}).storage().get() == x.storage().get());
  // view splitting a dim of a transposed tensor is fine (strides stay expressible).
  CHECK(t.view({2, 2, 3}).to_vector<double>() == t.to_vector<double>());
  CHECK_THROWS_WITH(x.view({5, 2}), Catch::Contains("invalid"));
  CHECK(x.view({-1, 6}).sizes() == Shape{2, 6});
}

TEST_CASE("view op values", "[views]") {
  Tensor x = iota({2, 3, 4});
  SECTION("narrow and slice") {
    CHECK(x.narrow(2, 1, 2).to_vector<double>() == std::vector<double>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});
    CHECK(slice(x, 2, 0, 4, 2).to_vector<double>() == std::vector<double>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22});
    CHECK(slice(x, 1, -2, 3).sizes() == Shape{2, 2, 4});
    CHECK(slice(x, 1, -2, 3).to_vector<double>()[0] == 4.0);
    CHECK_THROWS_WITH(x.narrow(1, 2, 2), Catch::Contains("narrow"));
  }
  SECTION("expand") {
    Tensor c = from_vector<double>({1, 2, 3}, {3, 1});
    Tensor e = c.expand({2, 3, 2});
    CHECK(e.sizes() == Shape{2, 3, 2});
    CHECK(e.stride(0) == 0);
    CHECK(e.to_vector<double>() == std::vector<double>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
    CHECK_THROWS_WITH(c.expand({3, 2, 2}), Catch::Contains("expand"));
  }
  SECTION("squeeze / unsqueeze") {
    Tensor u = x.unsqueeze(1);
    CHECK(u.sizes() == Shape{2, 1, 3, 4});
    CHECK(u.squeeze(1).sizes() == Shape{2, 3, 4});
    CHECK(x.squeeze(0).sizes() == Shape{2, 3, 4});  // not size 1: unchanged
    CHECK(x.unsqueeze(-1).sizes() == Shape{2, 3, 4, 1});
  }
  SECTION("permute / transpose / flatten") {
    Tensor p = x.permute({2, 0, 1});
    CHECK(p.sizes() == Shape{4, 2, 3});
    CHECK(p.to_vector<double>()[0 * 6 + 1 * 3 + 2] == 12 + 2 * 4);  // p[0][1][2] = x[1][2][0]
    CHECK(x.transpose(0, 2).to_vector<double>()[1] == 12.0);  // [0][0][1] = x[1][0][0]
    CHECK(x.flatten().sizes() == Shape{24});
    CHECK(x.flatten(1).sizes() == Shape{2, 12});
    CHECK(p.flatten(0, 1).to_vector<double>() == p.to_vector<double>());
    CHECK_THROWS_WITH(x.permute({0, 0, 1}), Catch::Contains("repeated"));
  }
}

TEST_CASE("view ops backward matches finite differences", "[views][grad]") {
  manual_seed(21);
  auto U = [](auto fn) -> GradFn { return [fn](const std::vector<Tensor>& v) { return fn(v[0]); }; };
  CHECK(gradcheck(U([](Tensor a) { return a.narrow(1, 1, 2); }), {leaf({3, 4})}) == "");
  CHECK(gradcheck(U([](Tensor a) { return slice(a, 1, 0, 4, 3); }), {leaf({3, 5})}) == "");
  CHECK(gradcheck(U([](Tensor a) { return a.expand({2, 3, 4}); }), {leaf({3, 1})}) == "");
  CHECK(gradcheck(U([](Tensor a) { return a.unsqueeze(1).squeeze(1); }), {leaf({3, 4})}) == "");
  CHECK(gradcheck(U([](Tensor a) { return a.permute({2, 0, 1}); }), {leaf({2, 3, 4})}) == "");
  CHECK(gradcheck(U([](Tensor a) { return a.t().reshape({12}); }), {leaf({3, 4})}) == "");
  CHECK(gradcheck(U([](Tensor a) { return a.view({4, 3}); }), {leaf({3, 4})}) == "");
  CHECK(gradcheck(U([](Tensor a) { return a.flatten(1); }), {leaf({2, 3, 2})}) == "");
  CHECK(gradcheck(U([](Tensor a) { return a.transpose(0, 1).contiguous(); }), {leaf({3, 4})}) == "");
  // Overlapping views of one input: their gradients add up.
  CHECK(gradcheck(U([](Tensor a) { return add(a.narrow(0, 0, 2), a.narrow(0, 1, 2)); }), {leaf({3, 4})}) == "");
}
