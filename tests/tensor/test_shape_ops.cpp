// cat / split / split_with_sizes / chunk: torch semantics (uneven splits, empty dims, legacy
// skipping of 1-D empty tensors in cat), views, and backward against finite differences.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;

namespace {
Tensor leaf(const Shape& s) { return uniform(s, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true); }
}  // namespace

TEST_CASE("cat forward", "[shape_ops]") {
  Tensor a = from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = from_vector<float>({5, 6}, {2, 1});
  CHECK(cat({a, b}, 1).to_vector<float>() == std::vector<float>{1, 2, 5, 3, 4, 6});
  CHECK(cat({a, b}, -1).sizes() == Shape{2, 3});
  CHECK(cat({a, a.t()}, 0).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 1, 3, 2, 4});
  CHECK(cat({a, zeros({0}), a}, 0).sizes() == Shape{4, 2});  // legacy: 1-D empty skipped
  CHECK(cat({zeros({0, 2}), a}, 0).sizes() == Shape{2, 2});
  CHECK_THROWS_WITH(cat({a, zeros({3, 3})}, 1), Catch::Contains("cat") && Catch::Contains("[3, 3]"));
  CHECK_THROWS_WITH(cat({a, zeros({2, 2}, DType::f64)}, 0), Catch::Contains("dtype"));
  CHECK_THROWS_WITH(cat({}, 0), Catch::Contains("non-empty"));
}

TEST_CASE("split / chunk follow torch", "[shape_ops]") {
  Tensor x = arange(0, 10, 1, DType::f32).reshape({5, 2});
  auto s = split(x, 2, 0);
  REQUIRE(s.size() == 3);
  CHECK(s[2].sizes() == Shape{1, 2});
  CHECK(s[1].to_vector<float>() == std::vector<float>{4, 5, 6, 7});
  CHECK(s[0].storage() == x.storage());  // views
  auto w = split_with_sizes(x, {1, 0, 4}, 0);
  CHECK(w[1].sizes() == Shape{0, 2});
  CHECK(w[2].to_vector<float>()[0] == 2.0f);
  CHECK_THROWS_WITH(split_with_sizes(x, {1, 2}, 0), Catch::Contains("sum to 3"));
  auto c = chunk(x, 3, 0);  // ceil(5/3) = 2 -> 2, 2, 1
  REQUIRE(c.size() == 3);
  CHECK(c[2].sizes() == Shape{1, 2});
  CHECK(chunk(x, 4, 0).size() == 3);  // torch: chunk size 2 -> 3 chunks
  CHECK(chunk(x, 2, 1)[1].to_vector<float>() == std::vector<float>{1, 3, 5, 7, 9});
  CHECK(chunk(zeros({0, 2}), 3, 0).size() == 3);
  CHECK(split(zeros({0, 2}), 0, 0).size() == 1);
  CHECK_THROWS_WITH(split(x, 0, 0), Catch::Contains("split_size"));
  CHECK_THROWS_WITH(chunk(x, 0, 0), Catch::Contains("chunks"));
}

TEST_CASE("cat / split backward", "[shape_ops][grad]") {
  manual_seed(5);
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return cat({v[0], v[1], v[2]}, 1); },
                  {leaf({2, 3}), leaf({2, 1}), leaf({2, 0})}) == "");
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return cat({v[0].t(), v[1]}, 0); }, {leaf({3, 2}), leaf({1, 3})}) ==
        "");
  CHECK(gradcheck(
            [](const std::vector<Tensor>& v) {
              auto p = split(v[0], 2, 1);
              return cat({mul(p[2], 3.0), p[0], p[1]}, 1);
            },
            {leaf({2, 5})}) == "");
  CHECK(gradcheck(
            [](const std::vector<Tensor>& v) {
              auto p = chunk(v[0].t(), 2, 0);
              return mul(p[0], p[1]);
            },
            {leaf({3, 4})}) == "");
  // only one chunk used: the other gets zero gradient
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return chunk(v[0], 2, 0)[1]; }, {leaf({4, 2})}) == "");
}
