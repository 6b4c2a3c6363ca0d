// Reductions: sum / mean / amax / max / argmax / all / any over dims with and without keepdim,
// empty tensors, long rows (summed in blocks) against a sequential f64 sum and across thread
// counts, and backward against finite differences.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cmath>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;

namespace {
Tensor iota(const Shape& s) { return arange(0, static_cast<double>(shape_numel(s)), 1, DType::f64).reshape(s); }
Tensor leaf(const Shape& s) { return uniform(s, -1.0, 1.0, TensorOptions(DType::f64)).set_requires_grad(true); }
using V = std::vector<Tensor>;
}  // namespace

TEST_CASE("sum and mean over dims", "[reduction]") {
  Tensor x = iota({2, 3, 4});
  CHECK(sum(x).item<double>() == 276.0);
  CHECK(sum(x).dim() == 0);
  CHECK(sum(x, {1}).sizes() == Shape{2, 4});
  CHECK(sum(x, {1}).to_vector<double>() == std::vector<double>{12, 15, 18, 21, 48, 51, 54, 57});
  CHECK(sum(x, {1}, true).sizes() == Shape{2, 1, 4});
  CHECK(sum(x, {0, 2}).to_vector<double>() == std::vector<double>{60, 92, 124});
  CHECK(sum(x, {-1}).to_vector<double>() == std::vector<double>{6, 22, 38, 54, 70, 86});
  CHECK(sum(x, {0, 2}, true).sizes() == Shape{1, 3, 1});
  CHECK(mean(x, {2}).to_vector<double>() == std::vector<double>{1.5, 5.5, 9.5, 13.5, 17.5, 21.5});
  CHECK(mean(x).item<double>() == 11.5);
  CHECK(mean(x, {0, 1}, true).sizes() == Shape{1, 1, 4});
  // Non-contiguous input.
  CHECK(sum(x.transpose(0, 2), {2}).to_vector<double>() == sum(x, {0}).t().to_vector<double>());
  CHECK_THROWS_WITH(sum(x, {3}), Catch::Contains("dim"));
  CHECK_THROWS_WITH(mean(zeros({2}, DType::i64)), Catch::Contains("floating"));
}

TEST_CASE("sum of long rows (blocks in parallel) equals a sequential sum for any thread count", "[reduction]") {
  // 100003 elements: 6 blocks of 16384 and a partial one; 3 rows of them, and one row (a loss)
  manual_seed(3);
  const Tensor x32 = uniform({3, 100003}, -1, 1, TensorOptions(DType::f32));
  const Tensor x64 = to_dtype(x32, DType::f64), xi = arange(0, 300009, 1, DType::i64).reshape({3, 100003});
  std::vector<double> ref(3, 0.0);
  const std::vector<double> v = x64.to_vector<double>();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t r = 0; r < 100003; ++r) ref[i] += v[i * 100003 + r];
  const double total = ref[0] + ref[1] + ref[2];
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const float one32 = sum(x32).item<float>();
  const std::vector<double> rows64 = sum(x64, {1}).to_vector<double>();
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    INFO("threads " << t);
    const std::vector<double> r64 = sum(x64, {1}).to_vector<double>();
    const std::vector<float> r32 = sum(x32, {-1}).to_vector<float>();
    for (int64_t i = 0; i < 3; ++i) {
      CHECK(std::abs(r64[i] - ref[i]) < 1e-10);  // f64 sums of 1e5 values in [-1, 1] in another order
      CHECK(r64[i] == rows64[i]);                 // bit-equal to one thread
      CHECK(r32[i] == static_cast<float>(ref[i]));  // accumulated in f64, rounded once
    }
    CHECK(sum(x32).item<float>() == one32);
    CHECK(std::abs(sum(x64).item<double>() - total) < 1e-10);
    CHECK(sum(xi).item<int64_t>() == int64_t{300009} * 300008 / 2);  // integers exact
  }
  omp_set_num_threads(saved);
}

TEST_CASE("amax, max and argmax", "[reduction]") {
  Tensor x = from_vector<double>({1, 7, 3, 9, 2, 9, 0, -1, 5, 4, 8, 6}, {3, 4});
  CHECK(amax(x).item<double>() == 9.0);
  CHECK(amax(x, {1}).to_vector<double>() == std::vector<double>{9, 9, 8});
  CHECK(amax(x, {0}, true).sizes() == Shape{1, 4});
  CHECK(amax(x, {0}).to_vector<double>() == std::vector<double>{5, 9, 8, 9});
  auto [v, i] = max(x, 1);
  CHECK(v.to_vector<double>() == std::vector<double>{9, 9, 8});
  CHECK(i.dtype() == DType::i64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{3, 1, 2});  // first of tied maxima
  auto [vk, ik] = max(x, 0, true);
  CHECK(vk.sizes() == Shape{1, 4});
  CHECK(ik.to_vector<int64_t>() == std::vector<int64_t>{2, 1, 2, 0});
  CHECK(argmax(x, -1).to_vector<int64_t>() == std::vector<int64_t>{3, 1, 2});
  CHECK(argmax(x, 0, true).sizes() == Shape{1, 4});
}

TEST_CASE("all and any are logical and / or over dims (torch.all / torch.any)", "[reduction]") {
  // 1 0 2 | 0 0 0 | 3 4 5 (nonzero = true; NaN counts as true, as in PyTorch)
  Tensor x = from_vector<double>({1, 0, 2, 0, 0, 0, 3, 4, std::nan("")}, {3, 3});
  CHECK(all(x).dtype() == DType::bool_);
  CHECK(all(x).dim() == 0);
  CHECK(all(x).item<bool>() == false);
  CHECK(any(x).item<bool>() == true);
  CHECK(all(x, {1}).to_vector<bool>() == std::vector<bool>{false, false, true});
  CHECK(any(x, {1}).to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(all(x, {0}, true).sizes() == Shape{1, 3});
  CHECK(all(x, {0}).to_vector<bool>() == std::vector<bool>{false, false, false});
  CHECK(any(x, {0}).to_vector<bool>() == std::vector<bool>{true, true, true});
  CHECK(any(x.t(), {0}).to_vector<bool>() == std::vector<bool>{true, false, true});  // non-contiguous
  // Every dtype in, including bool and integers.
  Tensor b = gt(x, 0.5);
  CHECK(all(b, {1}).to_vector<bool>() == std::vector<bool>{false, false, false});  // NaN > 0.5 is false
  CHECK(any(b, {1}).to_vector<bool>() == std::vector<bool>{true, false, true});
  Tensor i = from_vector<int64_t>({-3, 1, 0, 7}, {2, 2});
  CHECK(all(i, {1}).to_vector<bool>() == std::vector<bool>{true, false});
  CHECK(any(to_dtype(x, DType::f32), {1}).to_vector<bool>() == std::vector<bool>{true, false, true});
  // Empty reductions give the identities: all -> true, any -> false.
  Tensor e = zeros({2, 0}, DType::f64);
  CHECK(all(e, {1}).to_vector<bool>() == std::vector<bool>{true, true});
  CHECK(any(e, {1}).to_vector<bool>() == std::vector<bool>{false, false});
  CHECK(all(e).item<bool>() == true);
  CHECK(any(e).item<bool>() == false);
  CHECK_THROWS_WITH(all(x, {2}), Catch::Contains("dim"));
}

TEST_CASE("reductions of empty tensors", "[reduction]") {
  Tensor e = zeros({2, 0, 3}, DType::f64);
  CHECK(sum(e).item<double>() == 0.0);
  CHECK(sum(e, {1}).sizes() == Shape{2, 3});
  CHECK(sum(e, {1}).to_vector<double>() == std::vector<double>(6, 0.0));
  CHECK(sum(e, {2}).sizes() == Shape{2, 0});
  CHECK(std::isnan(mean(e).item<double>()));  // 0 / 0, like PyTorch
  CHECK(amax(e, {2}).sizes() == Shape{2, 0});
  CHECK(max(e, 2).first.sizes() == Shape{2, 0});
  // A maximum over an empty dim has no value (PyTorch raises too).
  CHECK_THROWS(amax(e, {1}));
  CHECK_THROWS(max(e, 1));
}

TEST_CASE("reductions backward matches finite differences", "[reduction][grad]") {
  manual_seed(41);
  CHECK(gradcheck([](const V& v) { return sum(v[0]); }, {leaf({3, 4})}) == "");
  CHECK(gradcheck([](const V& v) { return sum(v[0], {1}); }, {leaf({2, 3, 4})}) == "");
  CHECK(gradcheck([](const V& v) { return sum(v[0], {0, 2}, true); }, {leaf({2, 3, 4})}) == "");
  CHECK(gradcheck([](const V& v) { return mean(v[0], {-1}); }, {leaf({2, 3, 4})}) == "");
  CHECK(gradcheck([](const V& v) { return mean(v[0].t(), {0}, true); }, {leaf({3, 4})}) == "");
  // Random inputs have no ties, so max is differentiable at them.
  CHECK(gradcheck([](const V& v) { return amax(v[0], {1}); }, {leaf({3, 5})}) == "");
  CHECK(gradcheck([](const V& v) { return amax(v[0], {0, 2}, true); }, {leaf({2, 3, 4})}) == "");
  CHECK(gradcheck([](const V& v) { return max(v[0], 1).first; }, {leaf({3, 5})}) == "");
  CHECK(gradcheck([](const V& v) { return max(v[0], 0, true).first; }, {leaf({3, 5})}) == "");
  CHECK(gradcheck([](const V& v) { return sum(v[0], {1}); }, {leaf({2, 0, 3})}) == "");
}

TEST_CASE("amax splits the gradient among ties; max sends it to the chosen index", "[reduction][grad]") {
  Tensor x = from_vector<double>({1, 3, 3, 2}, {4}).set_requires_grad(true);
  amax(x).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0.5, 0});
  x.set_grad(Tensor());
  max(x, 0).first.backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 0});
}
