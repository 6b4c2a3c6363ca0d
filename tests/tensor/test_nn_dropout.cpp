// dropout: identity cases, mask from Philox (seed, offset + i), inverted scaling, backward uses
// the same mask, offsets advance, keep rate close to 1 - p.
#include <catch2/catch.hpp>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;

TEST_CASE("dropout identity cases and errors", "[dropout]") {
  Tensor x = ones({4, 5});
  CHECK(dropout(x, 0.5, false).is_same(x));
  CHECK(dropout(x, 0.0, true).is_same(x));
  CHECK(dropout(x, 1.0, true).to_vector<float>() == std::vector<float>(20, 0.f));
  CHECK_THROWS_WITH(dropout(x, 1.5, true), Catch::Contains("dropout") && Catch::Contains("1.5"));
}

TEST_CASE("dropout mask is philox_uniform(seed, offset + i) >= p", "[dropout]") {
  manual_seed(42);
  const double p = 0.3;
  Tensor x = arange(1, 101, 1, DType::f64).reshape({10, 10});
  const GeneratorState before = generator_state();
  Tensor y = dropout(x.t(), p, true);  // non-contiguous input: i is the index in y's row-major order
  CHECK(generator_state().offset == before.offset + 100);
  auto yv = y.to_vector<double>(), xv = contiguous(x.t()).to_vector<double>();
  int kept = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    const bool keep = static_cast<double>(philox_uniform(before.seed, before.offset + i)) >= p;
    CHECK(yv[i] == Approx(keep ? xv[i] / (1 - p) : 0.0));
    kept += keep;
  }
  CHECK(kept > 50);
  CHECK(kept < 90);
  // the next call draws fresh offsets: a different mask
  Tensor y2 = dropout(ones({100}, DType::f64), p, true);
  CHECK(generator_state().offset == before.offset + 200);
  auto y2v = y2.to_vector<double>();
  int same = 0;
  for (int i = 0; i < 100; ++i) same += ((yv[i] == 0) == (y2v[i] == 0));
  CHECK(same < 100);
}

TEST_CASE("dropout keep rate and backward mask", "[dropout][grad]") {
  manual_seed(7);
  const double p = 0.25;
  Tensor x = ones({300, 300}, DType::f64).set_requires_grad(true);  // parallel path
  Tensor y = dropout(x, p, true);
  const double mean_y = mean(y).item<double>();
  CHECK(mean_y == Approx(1.0).margin(0.02));  // inverted dropout keeps the expectation
  Tensor g = arange(0, 90000, 1, DType::f64).reshape({300, 300});
  y.backward(g);
  // gradient = same mask * g / (1 - p) = y * g (since x = 1)
  CHECK(dtr::testing::max_abs_diff(x.grad(), mul(y.detach(), g)) == 0.0);
  // bf16 input keeps its dtype
  CHECK(dropout(ones({8}, DType::bf16), 0.5, true).dtype() == DType::bf16);
}

TEST_CASE("dropout backward matches finite differences with a fixed mask", "[dropout][grad]") {
  manual_seed(31);
  const GeneratorState s0 = generator_state();
  // restoring the generator state before each call fixes (seed, offset) and so the mask
  auto f = [s0](const std::vector<Tensor>& v) {
    set_generator_state(s0);
    return dropout(v[0].t(), 0.4, true);
  };
  CHECK(dtr::testing::gradcheck(f, {uniform({5, 4}, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true)}) == "");
}
