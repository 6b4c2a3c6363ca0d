// lora_linear (one autograd node, the adapter term accumulated into the base GEMM's output)
// against the composed formula linear + linear + linear + add: forward and the gradients of x,
// W, b, A, B (f64 and f32, 2-d and 3-d inputs, a separate adapter input), f64 finite
// differences; LoRALinear's forward through it with dropout off / pre / post equal to the
// composed path (hooked adapters take that one), errors.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/nn/lora_linear.h"
#include "tensor/random.h"

using namespace dtr;
using namespace dtr::nn;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {

/// The composed LoRA linear: linear(x, W, b) + linear(scale * linear(xa, A), B).
Tensor composed(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& A, const Tensor& B, double s,
                const Tensor& xa) {
  return add(linear(x, W, b), linear(mul(linear(xa.defined() ? xa : x, A), s), B));
}

struct Grads {
  Tensor y;
  std::vector<Tensor> g;  // x, W, b, A, B, xa
};

/// y and the gradients of sum(y * u) (u fixed, not all ones) for fresh leaves.
template <class F>
Grads run(F f, const std::vector<Tensor>& v) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : v) leaves.push_back(t.defined() ? t.clone().set_requires_grad(true) : Tensor());
  Tensor y = f(leaves);
  std::vector<double> w(static_cast<size_t>(y.numel()));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.37 * static_cast<double>(i) + 0.1);
  const Tensor u = to_dtype(from_vector<double>(w, y.sizes()), y.dtype());
  sum(mul(y, u)).backward();
  Grads r{y.detach(), {}};
  for (const Tensor& t : leaves) r.g.push_back(t.defined() ? t.grad() : Tensor());
  return r;
}

}  // namespace

TEST_CASE("lora_linear equals the composed LoRA linear (forward, dX, dW, db, dA, dB)", "[lora][fused]") {
  manual_seed(31);
  const int64_t in = 12, out = 10, r = 3;
  const double s = 1.75;
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f64 ? 1e-12 : 2e-5;
    for (bool three_d : {false, true}) {
      for (bool sep : {false, true}) {
        INFO(dt << " 3-d " << three_d << " separate adapter input " << sep);
        const Shape xs = three_d ? Shape{2, 7, in} : Shape{7, in};
        const std::vector<Tensor> v{randn(xs, dt),           randn({out, in}, dt), randn({out}, dt),
                                    randn({r, in}, dt),      randn({out, r}, dt),  sep ? randn(xs, dt) : Tensor()};
        const Grads ref =
            run([&](const std::vector<Tensor>& l) { return composed(l[0], l[1], l[2], l[3], l[4], s, l[5]); }, v);
        const Grads got =
            run([&](const std::vector<Tensor>& l) { return lora_linear(l[0], l[1], l[2], l[3], l[4], s, l[5]); }, v);
        REQUIRE(got.y.sizes() == ref.y.sizes());
        CHECK(max_abs_diff(got.y, ref.y) < tol);
        for (size_t i = 0; i < v.size(); ++i) {
          INFO("gradient " << i);
          if (!v[i].defined()) continue;
          REQUIRE(got.g[i].defined());
          CHECK(got.g[i].sizes() == v[i].sizes());
          CHECK(max_abs_diff(got.g[i], ref.g[i]) < tol);
        }
      }
    }
  }
  // Frozen base without bias (LoRA's case): only x, A, B get gradients.
  Tensor x = randn({5, in}, DType::f64).set_requires_grad(true), W = randn({out, in}, DType::f64);
  Tensor A = randn({r, in}, DType::f64).set_requires_grad(true), B = randn({out, r}, DType::f64).set_requires_grad(true);
  sum(lora_linear(x, W, Tensor(), A, B, s)).backward();
  CHECK_FALSE(W.grad().defined());
  CHECK(x.grad().defined());
  CHECK(A.grad().defined());
  CHECK(B.grad().defined());
}

TEST_CASE("lora_linear backward matches finite differences", "[lora][fused][grad]") {
  manual_seed(32);
  auto u = [](const Shape& sh) { return uniform(sh, -1, 1, TensorOptions(DType::f64).with_requires_grad()); };
  std::vector<Tensor> v{u({2, 3, 5}), u({4, 5}), u({4}), u({2, 5}), u({4, 2}), u({2, 3, 5})};
  CHECK(gradcheck([](const std::vector<Tensor>& a) { return lora_linear(a[0], a[1], a[2], a[3], a[4], 1.5); },
                  {v[0], v[1], v[2], v[3], v[4]}) == "");
  CHECK(gradcheck([](const std::vector<Tensor>& a) { return lora_linear(a[0], a[1], a[2], a[3], a[4], 0.5, a[5]); },
                  v) == "");
}

TEST_CASE("LoRALinear through lora_linear equals its composed path, dropout off / pre / post", "[lora][fused]") {
  for (int mode = 0; mode < 3; ++mode) {
    INFO("dropout mode " << mode);
    LoraOptions o;
    o.r = 4;
    o.alpha = 6;
    o.dropout = mode == 0 ? 0.0 : 0.3;
    o.dropout_position = mode == 2 ? LoraDropoutPosition::post : LoraDropoutPosition::pre;
    auto make = [&] {
      manual_seed(33);
      auto l = std::make_shared<LoRALinear>(std::make_shared<Linear>(9, 7, true, DType::f64), o);
      NoGradGuard ng;
      l->lora_B()->weight().copy_(normal({7, 4}, 0.0, 0.5, TensorOptions(DType::f64)));
      return l;
    };
    auto fused = make(), plain = make();
    // A hook on lora_A: the composed path (Module::call runs it); it changes nothing here.
    int calls = 0;
    plain->lora_A()->register_forward_hook(
        [&calls](Module&, const std::vector<Tensor>&, const std::vector<Tensor>&) -> std::optional<std::vector<Tensor>> {
          ++calls;
          return std::nullopt;
        });
    const Tensor x0 = randn({2, 6, 9}, DType::f64);
    std::vector<std::string> names;
    auto step = [&](LoRALinear& l) {
      manual_seed(34);  // the same dropout masks
      Tensor x = x0.clone().set_requires_grad(true);
      Tensor y = l.forward(x);
      names.push_back(y.grad_fn()->name());
      sum(mul(y, y)).backward();
      return std::vector<Tensor>{y.detach(), x.grad(), l.lora_A()->weight().grad(), l.lora_B()->weight().grad()};
    };
    const auto a = step(*fused), b = step(*plain);
    CHECK(calls == 1);
    // One node where the adapter is fused (not with dropout after B: it acts on B's output).
    CHECK(names[0] == (mode == 2 ? "addBackward" : "lora_linearBackward"));
    CHECK(names[1] == "addBackward");
    for (size_t i = 0; i < a.size(); ++i) {
      INFO("output " << i);
      CHECK(max_abs_diff(a[i], b[i]) < 1e-12);
    }
  }
}

TEST_CASE("lora_linear checks its operands", "[lora][fused]") {
  Tensor x = randn({3, 4}), W = randn({5, 4}), A = randn({2, 4}), B = randn({5, 2});
  CHECK_THROWS_WITH(lora_linear(randn({3, 6}), W, Tensor(), A, B, 1.0), Catch::Contains("does not match weight"));
  CHECK_THROWS_WITH(lora_linear(x, W, Tensor(), randn({2, 3}), B, 1.0), Catch::Contains("lora_A [2, 3]"));
  CHECK_THROWS_WITH(lora_linear(x, W, Tensor(), A, randn({5, 3}), 1.0), Catch::Contains("lora_B [5, 3]"));
  CHECK_THROWS_WITH(lora_linear(x, W, randn({4}), A, B, 1.0), Catch::Contains("bias"));
  CHECK_THROWS_WITH(lora_linear(x, W, Tensor(), A, B, 1.0, randn({3, 5})), Catch::Contains("lora_input"));
  CHECK_THROWS_WITH(lora_linear(x, W, Tensor(), to_dtype(A, DType::f64), B, 1.0), Catch::Contains("dtype"));
}
