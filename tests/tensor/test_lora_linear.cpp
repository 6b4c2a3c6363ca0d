// nn::LoRALinear: forward against the formula, finite-difference gradients of A and B (f64),
// frozen base, merge / unmerge, rsLoRA scale, init statistics, dropout positions.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/nn/lora_linear.h"
#include "tensor/random.h"

using namespace dtr;
using namespace dtr::nn;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {

// f64 throughout: the only error left is rounding of a few dozen products.
constexpr double kF64Tol = 1e-12;

/// y[n, o] = b[o] + sum_i x[n, i] W[o, i] + scale * sum_k B[o, k] sum_i A[k, i] x[n, i], in loops.
std::vector<double> reference(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& A, const Tensor& B,
                              double scale) {
  const int64_t N = x.size(0), I = x.size(1), O = W.size(0), R = A.size(0);
  auto vx = x.to_vector<double>(), vw = W.to_vector<double>(), vb = b.to_vector<double>();
  auto va = A.to_vector<double>(), vB = B.to_vector<double>();
  std::vector<double> y(N * O);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double acc = vb[o];
      for (int64_t i = 0; i < I; ++i) acc += vx[n * I + i] * vw[o * I + i];
      for (int64_t k = 0; k < R; ++k) {
        double ax = 0;
        for (int64_t i = 0; i < I; ++i) ax += va[k * I + i] * vx[n * I + i];
        acc += scale * vB[o * R + k] * ax;
      }
      y[n * O + o] = acc;
    }
  return y;
}

std::shared_ptr<LoRALinear> make_lora(int64_t in, int64_t out, LoraOptions o, DType dt = DType::f64) {
  manual_seed(11);
  auto base = std::make_shared<Linear>(in, out, true, dt);
  auto l = std::make_shared<LoRALinear>(base, o);
  NoGradGuard ng;
  l->lora_B()->weight().copy_(normal({out, o.r}, 0.0, 0.5, TensorOptions(dt)));  // nonzero B
  return l;
}

}  // namespace

TEST_CASE("LoRALinear: layout, names, frozen base, B zeros at init") {
  manual_seed(3);
  auto base = std::make_shared<Linear>(6, 4);
  LoraOptions o;
  o.r = 2;
  o.alpha = 8;
  LoRALinear l(base, o);
  CHECK(l.type_name() == "LoRALinear");
  CHECK(l.weight().is_same(base->weight()));  // shared, not copied
  CHECK(l.bias().is_same(base->bias()));
  std::vector<std::string> names;
  for (auto& [n, p] : l.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"weight", "bias", "lora_A.weight", "lora_B.weight"});
  CHECK_FALSE(l.weight().requires_grad());
  CHECK_FALSE(l.bias().requires_grad());
  CHECK(l.lora_A()->weight().requires_grad());
  CHECK(l.lora_B()->weight().requires_grad());
  CHECK(l.lora_A()->weight().sizes() == Shape{2, 6});
  CHECK(l.lora_B()->weight().sizes() == Shape{4, 2});
  CHECK_FALSE(l.lora_A()->has_parameter("bias"));
  for (float v : l.lora_B()->weight().to_vector<float>()) CHECK(v == 0.0f);
  CHECK(l.scale() == Approx(4.0));
  // B = 0: the layer starts as the base layer exactly.
  Tensor x = randn({3, 6});
  CHECK(max_abs_diff(l.forward(x), base->forward(x)) == 0.0);
}

TEST_CASE("LoRALinear: forward equals W x + b + scale * B A x") {
  for (bool rs : {false, true}) {
    LoraOptions o;
    o.r = 3;
    o.alpha = 6;
    o.use_rslora = rs;
    auto l = make_lora(5, 4, o);
    const double scale = rs ? 6.0 / std::sqrt(3.0) : 2.0;
    CHECK(l->scale() == Approx(scale).epsilon(1e-15));
    Tensor x = randn({7, 5}, TensorOptions(DType::f64));
    auto ref = reference(x, l->weight(), l->bias(), l->lora_A()->weight(), l->lora_B()->weight(), scale);
    CHECK(max_abs_diff(l->forward(x), from_vector(ref, {7, 4})) < kF64Tol);
    // Leading batch dims pass through.
    Tensor x3 = reshape(x, {7, 1, 5});
    CHECK(l->forward(x3).sizes() == Shape{7, 1, 4});
  }
}

TEST_CASE("LoRALinear: finite-difference gradients of A, B and x; base gets no gradient") {
  LoraOptions o;
  o.r = 2;
  o.alpha = 3;
  auto l = make_lora(4, 3, o);
  Tensor A = l->lora_A()->weight(), B = l->lora_B()->weight();
  Tensor x = randn({5, 4}, TensorOptions(DType::f64).with_requires_grad());
  std::string err = gradcheck([&](const std::vector<Tensor>& in) { return l->forward(in[2]); }, {A, B, x});
  CHECK(err == "");
  // Base frozen: a backward leaves W and b without gradients.
  A.set_grad(Tensor());
  sum(l->forward(x)).backward();
  CHECK_FALSE(l->weight().grad().defined());
  CHECK_FALSE(l->bias().grad().defined());
  CHECK(A.grad().defined());
}

TEST_CASE("LoRALinear: merge / unmerge round trip") {
  LoraOptions o;
  o.r = 4;
  o.alpha = 2;
  auto l = make_lora(6, 5, o);
  Tensor x = randn({3, 6}, TensorOptions(DType::f64));
  const Tensor w0 = clone(l->weight());
  const Tensor y0 = l->forward(x);
  const Tensor mw = l->merged_weight();
  l->merge();
  CHECK(l->merged());
  CHECK(max_abs_diff(l->weight(), mw) < kF64Tol);
  CHECK(max_abs_diff(l->forward(x), y0) < kF64Tol);  // adapter now inside W, not added twice
  CHECK_THROWS_WITH(l->merge(), Catch::Contains("already merged"));
  l->unmerge();
  CHECK_FALSE(l->merged());
  CHECK(max_abs_diff(l->weight(), w0) < kF64Tol);
  CHECK(max_abs_diff(l->forward(x), y0) < kF64Tol);
  CHECK_THROWS_WITH(l->unmerge(), Catch::Contains("not merged"));
}

TEST_CASE("LoRALinear: dropout pre / post; eval mode equals no dropout") {
  Tensor x = randn({64, 8}, TensorOptions(DType::f64));
  LoraOptions plain;
  plain.r = 2;
  plain.alpha = 2;
  const Tensor ref = make_lora(8, 6, plain)->forward(x);
  for (auto pos : {LoraDropoutPosition::pre, LoraDropoutPosition::post}) {
    LoraOptions o = plain;
    o.dropout = 0.5;
    o.dropout_position = pos;
    auto l = make_lora(8, 6, o);
    l->eval();
    CHECK(max_abs_diff(l->forward(x), ref) == 0.0);
    l->train();
    const Tensor base = linear(x, l->weight(), l->bias());
    const Tensor full = sub(ref, base);  // scale * B A x without dropout
    const Tensor got = sub(l->forward(x), base);
    auto g = got.to_vector<double>(), f = full.to_vector<double>();
    if (pos == LoraDropoutPosition::post) {
      // Each output element of the branch is either dropped or scaled by 1 / (1 - p) = 2.
      int dropped = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        const bool zero = std::abs(g[i]) < 1e-15, twice = std::abs(g[i] - 2 * f[i]) < 1e-12;
        CHECK((zero || twice));
        dropped += zero;
      }
      CHECK(dropped > 0);
      CHECK(dropped < static_cast<int>(g.size()));
    } else {
      // Dropout on the input: the branch differs from the undropped one, the base does not.
      CHECK(max_abs_diff(got, full) > 1e-6);
    }
  }
}

TEST_CASE("LoRALinear: init of A (Kaiming-uniform, Xavier-normal)") {
  manual_seed(5);
  const int64_t in = 400, out = 8, r = 64;
  auto base = std::make_shared<Linear>(in, out, false);
  LoraOptions o;
  o.r = r;
  o.init = LoraInit::kaiming;
  auto k = LoRALinear(base, o).lora_A()->weight().to_vector<float>();
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  double sq = 0, mx = 0;
  for (float v : k) {
    mx = std::max(mx, static_cast<double>(std::abs(v)));
    sq += v * v;
  }
  CHECK(mx <= bound);
  // U(-b, b) has variance b^2 / 3; 25600 samples: relative std of the estimate ~ 0.6%.
  CHECK(sq / k.size() == Approx(bound * bound / 3).epsilon(0.05));
  o.init = LoraInit::xavier;
  auto x = LoRALinear(base, o).lora_A()->weight().to_vector<float>();
  sq = 0;
  for (float v : x) sq += v * v;
  CHECK(sq / x.size() == Approx(2.0 / (in + r)).epsilon(0.05));
}

TEST_CASE("LoRALinear: bad options") {
  auto base = std::make_shared<Linear>(4, 4);
  LoraOptions o;
  o.r = 0;
  CHECK_THROWS_WITH(LoRALinear(base, o), Catch::Contains("rank r must be positive"));
  o.r = 2;
  o.dropout = 1.0;
  CHECK_THROWS_WITH(LoRALinear(base, o), Catch::Contains("dropout must be in [0, 1)"));
  CHECK_THROWS_WITH(LoRALinear(nullptr, LoraOptions{}), Catch::Contains("null"));
  CHECK_THROWS_WITH(lora_dropout_position_from_string("middle"), Catch::Contains("\"pre\" or \"post\""));
  CHECK(lora_init_from_string("kaiming") == LoraInit::kaiming);
}
