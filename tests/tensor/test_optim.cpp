// Optimizers: AdamW against PyTorch's numbers (tests/golden/adamw_fixture.json, written by
// tests/golden/make_adamw_fixture.py), SGD with momentum against a hand loop, bf16 params,
// zero_grad, the optim_local hook, and LR schedule values at key steps.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gradcheck.h"
#include "tensor/optim/adamw.h"
#include "tensor/optim/local.h"
#include "tensor/optim/lr_scheduler.h"
#include "tensor/optim/sgd.h"
#include "tensor/random.h"

using namespace dtr;
using namespace dtr::optim;
using json = nlohmann::json;

namespace {
// f64: the same operations in the same order as torch (bitwise equal with torch 2.15); the
// margin only allows for FMA contraction differences in other builds, O(1e-16) per step.
constexpr double kF64Tol = 1e-12;
// f32: parameters of size < 2 (ulp <= 1.2e-7); the observed worst is 1 ulp (1.5e-8 on values
// ~0.3); allow ~2 ulps at the largest magnitude for FMA / ordering differences.
constexpr double kF32Tol = 2.5e-7;

json load_fixture() {
  std::ifstream f("tests/golden/adamw_fixture.json");
  REQUIRE(f.good());
  return json::parse(f);
}

Tensor tensor_of(const json& values, const json& shape, DType dt) {
  return from_vector<double>(values.get<std::vector<double>>(), shape.get<Shape>()).to(dt);
}

void run_adamw_fixture(DType dt, const char* key, double tol) {
  const json fx = load_fixture();
  const json& hp = fx["hyperparameters"];
  const std::vector<std::string> names{"w", "b"};
  std::vector<Tensor> params;
  for (const auto& n : names) params.push_back(tensor_of(fx["init"][n], fx["shapes"][n], dt).set_requires_grad(true));
  AdamW opt(params, AdamWOptions{hp["lr"].get<double>(), hp["beta1"].get<double>(), hp["beta2"].get<double>(),
                                 hp["eps"].get<double>(), hp["weight_decay"].get<double>()});
  const json& grads = fx["grads"];
  const json& expect = fx[key];
  REQUIRE(grads.size() == 10);
  for (size_t step = 0; step < grads.size(); ++step) {
    for (size_t k = 0; k < names.size(); ++k) {
      const json& g = grads[step][names[k]];
      params[k].set_grad(g.is_null() ? Tensor() : tensor_of(g, fx["shapes"][names[k]], dt));
    }
    opt.step();
    for (size_t k = 0; k < names.size(); ++k) {
      INFO("step " << step + 1 << " param " << names[k] << " dtype " << dt);
      auto got = params[k].to_vector<double>();
      auto want = expect[step][names[k]].get<std::vector<double>>();
      REQUIRE(got.size() == want.size());
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
      CHECK(worst < tol);
    }
  }
  CHECK(opt.state(params[0]).step == 10);
  CHECK(opt.state(params[1]).step == 9);  // b had no gradient at step 4
}
}  // namespace

TEST_CASE("AdamW matches torch.optim.AdamW over 10 steps", "[optim][adamw]") {
  SECTION("f64") { run_adamw_fixture(DType::f64, "params_f64", kF64Tol); }
  SECTION("f32") { run_adamw_fixture(DType::f32, "params_f32", kF32Tol); }
}

TEST_CASE("AdamW on bf16 parameters tracks the f32 result within bf16 rounding", "[optim][adamw]") {
  manual_seed(51);
  Tensor p32 = uniform({64}, -1, 1).set_requires_grad(true);
  Tensor p16 = p32.detach().to(DType::bf16).set_requires_grad(true);
  Tensor ref = p16.detach().to(DType::f32).set_requires_grad(true);  // same start as p16
  AdamW a16({p16}, AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  AdamW a32({ref}, AdamWOptions{1e-2, 0.9, 0.95, 1e-8, 0.1});
  for (int s = 0; s < 3; ++s) {
    Tensor g = uniform({64}, -1, 1);
    p16.set_grad(g.to(DType::bf16));
    ref.set_grad(g.to(DType::bf16).to(DType::f32));
    a16.step();
    a32.step();
  }
  CHECK(a16.state(p16).tensors.at("exp_avg").dtype() == DType::f32);
  // Each step rounds the parameter to bf16 once: relative error 2^-8 per step, |p| <= ~1.05.
  CHECK(testing::max_abs_diff(p16.to(DType::f32), ref) < 3 * 1.1 * std::pow(2.0, -8));
}

TEST_CASE("AdamW on a large parameter (OpenMP path) equals the scalar formula", "[optim][adamw]") {
  manual_seed(52);
  const int64_t n = 70000;  // above the parallel threshold
  // beta1 0.9 and 0.3 take the two branches of the two-sided lerp (1 - beta1 below / above 0.5);
  // f32 runs the vectorised loop of the f32 math type.
  const double b1 = GENERATE(0.9, 0.3);
  const DType dt = GENERATE(DType::f64, DType::f32);
  INFO("beta1 " << b1 << " dtype " << dt);
  const double lr = 1e-2, b2 = 0.95, eps = 1e-8, wd = 0.1;
  Tensor p = uniform({n}, -1, 1, TensorOptions(dt)).set_requires_grad(true);
  std::vector<double> ref = p.to_vector<double>(), m(n, 0.0), v(n, 0.0);
  AdamW opt({p}, AdamWOptions{lr, b1, b2, eps, wd});
  for (int t = 1; t <= 2; ++t) {
    Tensor g = uniform({n}, -1, 1, TensorOptions(dt));
    p.set_grad(g);
    opt.step();
    auto gv = g.to_vector<double>();
    const double bc1 = 1 - std::pow(b1, t), bc2s = std::sqrt(1 - std::pow(b2, t));
    for (int64_t i = 0; i < n; ++i) {
      ref[i] *= 1 - lr * wd;
      m[i] += (1 - b1) * (gv[i] - m[i]);
      v[i] = v[i] * b2 + (1 - b2) * gv[i] * gv[i];
      ref[i] -= lr / bc1 * (m[i] / (std::sqrt(v[i]) / bc2s + eps));
    }
  }
  auto got = p.to_vector<double>();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
  // f32: parameters of size <= 1 after two steps of size ~lr, each op rounded once: a few ulp.
  CHECK(worst < (dt == DType::f64 ? kF64Tol : 1e-6));
}

TEST_CASE("SGD with momentum, nesterov and weight decay equals a hand loop", "[optim][sgd]") {
  const double lr = 0.1, mom = 0.9, wd = 0.01;
  for (bool nesterov : {false, true}) {
    Tensor p = from_vector<double>({1.0, -2.0, 0.5}, {3}).set_requires_grad(true);
    SGD opt({p}, SGDOptions{lr, mom, 0.0, wd, nesterov});
    std::vector<double> ref{1.0, -2.0, 0.5}, buf(3, 0.0);
    for (int step = 1; step <= 5; ++step) {
      std::vector<double> g(3);
      for (int i = 0; i < 3; ++i) g[i] = std::sin(1.0 + i + 0.5 * step);
      p.set_grad(from_vector<double>(g, {3}));
      opt.step();
      for (int i = 0; i < 3; ++i) {
        double d = g[i] + wd * ref[i];
        buf[i] = step == 1 ? d : mom * buf[i] + d;
        d = nesterov ? d + mom * buf[i] : buf[i];
        ref[i] -= lr * d;
      }
      auto got = p.to_vector<double>();
      for (int i = 0; i < 3; ++i) CHECK(got[i] == Approx(ref[i]).epsilon(1e-14));
    }
  }
  Tensor q = zeros({2}, DType::f64).set_requires_grad(true);
  CHECK_THROWS_WITH(SGD({q}, SGDOptions{0.1, 0.0, 0.0, 0.0, true}), Catch::Contains("nesterov"));
}

TEST_CASE("plain SGD and parameter groups with their own lr / weight decay", "[optim][sgd]") {
  Tensor a = from_vector<double>({1.0, 2.0}, {2}).set_requires_grad(true);
  Tensor b = from_vector<double>({1.0, 2.0}, {2}).set_requires_grad(true);
  SGD opt({ParamGroup{{a}, std::nullopt, std::nullopt}, ParamGroup{{b}, 0.5, 0.1}}, SGDOptions{0.1});
  a.set_grad(ones({2}, DType::f64));
  b.set_grad(ones({2}, DType::f64));
  opt.step();
  CHECK(a.to_vector<double>() == std::vector<double>{0.9, 1.9});
  CHECK(b.to_vector<double>()[0] == Approx(1.0 - 0.5 * (1.0 + 0.1 * 1.0)));
  CHECK(b.to_vector<double>()[1] == Approx(2.0 - 0.5 * (1.0 + 0.1 * 2.0)));
  opt.set_lr(0.01);
  CHECK(*opt.param_groups()[1].lr == 0.01);
}

TEST_CASE("zero_grad, skipped parameters and construction errors", "[optim]") {
  Tensor a = ones({2}).set_requires_grad(true);
  Tensor b = ones({2}).set_requires_grad(true);
  AdamW opt({a, b}, AdamWOptions{});
  a.set_grad(ones({2}));
  opt.step();
  CHECK(opt.has_state(a));
  CHECK_FALSE(opt.has_state(b));  // no gradient: untouched
  CHECK(b.to_vector<float>() == std::vector<float>{1, 1});
  const uint32_t v = a.version();
  a.set_grad(ones({2}));
  opt.step();
  CHECK(a.version() == v + 1);  // the update is an in-place write
  opt.zero_grad(false);
  CHECK(a.grad().to_vector<float>() == std::vector<float>{0, 0});
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK_THROWS_WITH(AdamW({a, a}, AdamWOptions{}), Catch::Contains("more than one group"));
  CHECK_THROWS_WITH(AdamW(std::vector<Tensor>{}, AdamWOptions{}), Catch::Contains("empty"));
  CHECK_THROWS_WITH(AdamW({a}, AdamWOptions{1e-3, 1.0}), Catch::Contains("beta1"));
  Tensor nc = zeros({3, 2}).t().set_requires_grad(true);
  AdamW bad({nc}, AdamWOptions{});
  nc.set_grad(zeros({2, 3}));
  CHECK_THROWS_WITH(bad.step(), Catch::Contains("contiguous"));
}

TEST_CASE("optim_local returns plain tensors and refuses distributed ones without a converter", "[optim]") {
  Tensor t = ones({2});
  CHECK(optim_local(t).is_same(t));
  struct FakeSpec : DistributedSpec {
    std::string str() const override { return "FakeSpec"; }
  };
  Tensor d = ones({2});
  d.impl()->dist = std::make_shared<FakeSpec>();
  CHECK_THROWS_WITH(optim_local(d), Catch::Contains("no local-tensor converter"));
  Tensor local = ones({2});
  set_optim_local_converter([&](const Tensor&) { return local; });
  CHECK(optim_local(d).is_same(local));
  set_optim_local_converter({});
  CHECK_THROWS(optim_local(d));
}

TEST_CASE("LR schedules at key steps", "[optim][lr]") {
  Tensor p = ones({1}).set_requires_grad(true);
  SGD opt({p}, SGDOptions{1.0});
  SECTION("constant") {
    ConstantLR s(opt, 3e-4);
    CHECK(opt.lr() == 3e-4);
    s.step();
    CHECK(opt.lr() == 3e-4);
  }
  SECTION("warmup + cosine (NeMo / Megatron)") {
    const double max_lr = 1e-3, min_lr = 1e-4;
    WarmupCosineLR s(opt, max_lr, min_lr, 10, 110);
    CHECK(opt.lr() == 0.0);  // step 0
    CHECK(s.lr_at(1) == Approx(1e-4));
    CHECK(s.lr_at(5) == Approx(5e-4));
    CHECK(s.lr_at(10) == Approx(max_lr));
    CHECK(s.lr_at(60) == Approx(min_lr + 0.5 * (max_lr - min_lr)));  // half-way: cos(pi/2) = 0
    CHECK(s.lr_at(35) == Approx(min_lr + 0.5 * (max_lr - min_lr) * (1 + std::cos(M_PI * 0.25))));
    CHECK(s.lr_at(110) == Approx(min_lr));
    CHECK(s.lr_at(500) == min_lr);
    for (int i = 0; i < 5; ++i) s.step();
    CHECK(s.last_step() == 5);
    CHECK(opt.lr() == Approx(5e-4));
    s.set_step(60);
    CHECK(opt.lr() == Approx(5.5e-4));
  }
  SECTION("warmup from init_lr (NeMo Automodel's OptimizerParamScheduler: no step at lr 0)") {
    // Automodel defaults: init_lr = 0.1 max_lr, min_lr = 0.01 max_lr; lr = init + (max - init) * n / warmup.
    WarmupCosineLR s(opt, 1e-3, 1e-5, 10, 100, 1e-4);
    CHECK(opt.lr() == Approx(1e-4));  // the first optimizer step runs at init_lr
    CHECK(s.lr_at(5) == Approx(1e-4 + 0.5 * 9e-4));
    CHECK(s.lr_at(10) == Approx(1e-3));
    CHECK(s.lr_at(100) == Approx(1e-5));
    WarmupLinearLR c(opt, 2e-3, 2e-3, 4, 50, 2e-4);  // Megatron "constant" after warmup
    CHECK(c.lr_at(0) == Approx(2e-4));
    CHECK(c.lr_at(2) == Approx(1.1e-3));
    CHECK(c.lr_at(30) == Approx(2e-3));
    CHECK_THROWS_WITH(WarmupCosineLR(opt, 1e-3, 1e-4, 2, 10, 2e-3), Catch::Contains("init_lr"));
  }
  SECTION("warmup + linear decay") {
    WarmupLinearLR s(opt, 1.0, 0.0, 0, 100);
    CHECK(opt.lr() == 1.0);
    CHECK(s.lr_at(25) == Approx(0.75));
    CHECK(s.lr_at(100) == Approx(0.0));
    CHECK(s.lr_at(101) == 0.0);
  }
  SECTION("errors") {
    CHECK_THROWS_WITH(WarmupCosineLR(opt, 1e-3, 1e-4, 20, 10), Catch::Contains("warmup_steps"));
    CHECK_THROWS_WITH(WarmupCosineLR(opt, 1e-4, 1e-3, 0, 10), Catch::Contains("min_lr"));
  }
}
