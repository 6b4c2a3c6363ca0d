// embedding: forward gather (int64 / int32 ids, any shape, strided weight), scatter-add
// backward against finite differences (repeated ids), out-of-range errors.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;

TEST_CASE("embedding forward", "[embedding]") {
  Tensor w = arange(0, 12, 1, DType::f32).reshape({4, 3});
  Tensor ids = from_vector<int64_t>({3, 0, 3, 1}, {2, 2});
  Tensor y = embedding(ids, w);
  REQUIRE(y.sizes() == Shape{2, 2, 3});
  CHECK(y.to_vector<float>() == std::vector<float>{9, 10, 11, 0, 1, 2, 9, 10, 11, 3, 4, 5});
  Tensor ids32 = from_vector<int32_t>({2}, {1});
  CHECK(embedding(ids32, w).to_vector<float>() == std::vector<float>{6, 7, 8});
  // transposed weight view
  Tensor wt = arange(0, 12, 1, DType::f32).reshape({3, 4}).t();  // [4, 3], row r = {r, r+4, r+8}
  CHECK(embedding(from_vector<int64_t>({1}, {1}), wt).to_vector<float>() == std::vector<float>{1, 5, 9});
  CHECK(embedding(zeros({0}, DType::i64), w).sizes() == Shape{0, 3});
}

TEST_CASE("embedding errors", "[embedding]") {
  Tensor w = zeros({4, 3});
  CHECK_THROWS_WITH(embedding(from_vector<int64_t>({0, 1, 7}, {3}), w),
                    Catch::Contains("id 7") && Catch::Contains("position 2") && Catch::Contains("vocab size 4"));
  CHECK_THROWS_WITH(embedding(from_vector<int64_t>({-1}, {1}), w), Catch::Contains("id -1"));
  CHECK_THROWS_WITH(embedding(zeros({2}), w), Catch::Contains("int64"));
}

TEST_CASE("embedding backward scatter-adds", "[embedding][grad]") {
  manual_seed(1);
  Tensor ids = from_vector<int64_t>({1, 4, 1, 0, 1, 2}, {3, 2});
  Tensor w = uniform({5, 3}, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true);
  CHECK(gradcheck([ids](const std::vector<Tensor>& v) { return embedding(ids, v[0]); }, {w}) == "");
  CHECK(gradcheck([ids](const std::vector<Tensor>& v) { return embedding(ids, v[0].t()); },
                  {uniform({3, 5}, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true)}) == "");
  // hand-checked: gradient of sum(embedding) counts each id's occurrences (id 3 unused -> 0)
  Tensor w2 = zeros({5, 2}, DType::f64).set_requires_grad(true);
  sum(embedding(ids, w2)).backward();
  CHECK(w2.grad().to_vector<double>() == std::vector<double>{1, 1, 3, 3, 1, 1, 0, 0, 1, 1});
  // large (parallel column blocks)
  Tensor big = zeros({10, 200}, DType::f64).set_requires_grad(true);
  Tensor many = from_vector<int64_t>(std::vector<int64_t>(300, 7), {300});
  sum(embedding(many, big)).backward();
  CHECK(big.grad().narrow(0, 7, 1).to_vector<double>() == std::vector<double>(200, 300.0));
}
