// cross_entropy: hand-checked loss, ignore_index (including all ignored -> 0, no NaN),
// stability, target errors, backward against finite differences.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;

TEST_CASE("cross_entropy forward hand-checked", "[loss]") {
  Tensor logits = from_vector<double>({0, 1, 2, 5, 5, 5}, {2, 3});
  Tensor t = from_vector<int64_t>({2, 0}, {2});
  const double l0 = std::log(1 + std::exp(1.0) + std::exp(2.0)) - 2.0, l1 = std::log(3.0);
  CHECK(cross_entropy(logits, t).item<double>() == Approx((l0 + l1) / 2));
  CHECK(cross_entropy(logits, from_vector<int64_t>({2, -100}, {2})).item<double>() == Approx(l0));
  CHECK(cross_entropy(logits, from_vector<int64_t>({7, 1}, {2}), 7).item<double>() == Approx(l1));
  // every token ignored: 0 and a zero gradient, no NaN
  Tensor lg = logits.clone().set_requires_grad(true);
  Tensor loss = cross_entropy(lg, from_vector<int64_t>({-100, -100}, {2}));
  CHECK(loss.item<double>() == 0.0);
  loss.backward();
  CHECK(lg.grad().to_vector<double>() == std::vector<double>(6, 0.0));
  // large logits stay finite (f32)
  Tensor big = from_vector<float>({1000.f, 0.f, -1000.f}, {1, 3});
  CHECK(cross_entropy(big, from_vector<int64_t>({1}, {1})).item<float>() == Approx(1000.0f));
  CHECK(cross_entropy(zeros({0, 3}), zeros({0}, DType::i64)).item<float>() == 0.0f);
}

TEST_CASE("cross_entropy errors", "[loss]") {
  Tensor logits = zeros({2, 3});
  CHECK_THROWS_WITH(cross_entropy(logits, from_vector<int64_t>({1, 3}, {2})),
                    Catch::Contains("target 3") && Catch::Contains("position 1") && Catch::Contains("[0, 3)"));
  CHECK_THROWS_WITH(cross_entropy(logits, from_vector<int64_t>({-1, 0}, {2})), Catch::Contains("target -1"));
  CHECK_THROWS_WITH(cross_entropy(logits, zeros({3}, DType::i64)), Catch::Contains("targets"));
}

TEST_CASE("cross_entropy backward matches finite differences", "[loss][grad]") {
  manual_seed(9);
  Tensor x = uniform({5, 4}, -3, 3, TensorOptions(DType::f64)).set_requires_grad(true);
  Tensor t = from_vector<int64_t>({3, -100, 0, 2, -100}, {5});
  CHECK(gradcheck([t](const std::vector<Tensor>& v) { return cross_entropy(v[0], t); }, {x}) == "");
  Tensor xt = uniform({4, 5}, -3, 3, TensorOptions(DType::f64)).set_requires_grad(true);
  CHECK(gradcheck([t](const std::vector<Tensor>& v) { return mul(cross_entropy(v[0].t(), t), 2.5); }, {xt}) == "");
  Tensor t32 = from_vector<int32_t>({1, 1, 0, 3, 2}, {5});
  CHECK(gradcheck([t32](const std::vector<Tensor>& v) { return cross_entropy(v[0], t32); }, {x}) == "");
}

TEST_CASE("cross_entropy equals the composite log_softmax formula on a large input", "[loss]") {
  manual_seed(12);
  const int64_t N = 64, C = 1000;  // parallel path
  Tensor x = mul(randn({N, C}, DType::f64), 4.0);
  std::vector<int64_t> t(N);
  std::vector<double> onehot(static_cast<size_t>(N * C), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    t[i] = (i * 37) % C;
    if (i % 5 == 0) t[i] = -100;
    else onehot[i * C + t[i]] = 1.0;
  }
  const double count = static_cast<double>(N - (N + 4) / 5);
  Tensor oh = from_vector<double>(onehot, {N, C});
  Tensor xa = x.clone().set_requires_grad(true), xb = x.clone().set_requires_grad(true);
  Tensor a = cross_entropy(xa, from_vector<int64_t>(t, {N}));
  Tensor b = div(neg(sum(mul(log_softmax(xb, 1), oh))), count);
  CHECK(a.item<double>() == Approx(b.item<double>()).epsilon(1e-13));
  a.backward();
  b.backward();
  CHECK(dtr::testing::max_abs_diff(xa.grad(), xb.grad()) < 1e-14);
}

TEST_CASE("cross_entropy f32 backward equals (softmax - onehot) * g / count in f64", "[loss]") {
  // The f32 kernel's one-exp path (exp(x - max) stored, scaled by g / (count * sum)): rows of
  // 3001 logits (partial packets and a partial sum block), an ignored row, a large logit range.
  manual_seed(14);
  const int64_t N = 6, C = 3001;
  Tensor x32 = mul(randn({N, C}), 6.0);
  x32.narrow(0, 0, 1).narrow(1, C - 1, 1).fill_(200.0);  // row maxima in the tail packet and
  x32.narrow(0, 1, 1).narrow(1, 1, 1).fill_(150.0);      // in the first: exp overflows if missed
  const Tensor x = x32.to(DType::f64);
  std::vector<int64_t> t{5, 3000, -100, 0, 1234, 17};
  std::vector<double> onehot(static_cast<size_t>(N * C), 0.0);
  for (int64_t i = 0; i < N; ++i)
    if (t[i] >= 0) onehot[i * C + t[i]] = 1.0;
  Tensor a = x32.clone().set_requires_grad(true);
  mul(cross_entropy(a, from_vector<int64_t>(t, {N})), 2.0).backward();
  Tensor valid = from_vector<double>({1, 1, 0, 1, 1, 1}, {N, 1});
  Tensor ref = mul(mul(sub(softmax(x, 1), from_vector<double>(onehot, {N, C})), valid), 2.0 / 5.0);
  CHECK(dtr::testing::max_abs_diff(a.grad().to(DType::f64), ref) < 1e-7);
  Tensor lse = add(amax(x, {1}, true), log(sum(exp(sub(x, amax(x, {1}, true))), {1}, true)));
  std::vector<double> pick;
  for (int64_t i = 0; i < N; ++i)
    if (t[i] >= 0) pick.push_back(lse.to_vector<double>()[i] - x.to_vector<double>()[i * C + t[i]]);
  double want = 0;
  for (double p : pick) want += p / 5.0;
  CHECK(cross_entropy(x32, from_vector<int64_t>(t, {N})).item<double>() == Approx(want).epsilon(1e-6));
}

TEST_CASE("cross_entropy f32 propagates a NaN in a leading block with no finite logit", "[loss]") {
  // The online logsumexp skips a block whose maximum is -inf (nothing visible yet); a NaN in
  // such a block must still make the row's loss and gradient NaN, as the f64 path and PyTorch
  // do: row 0 starts with a whole block (512 logits) of NaN, row 1 with -inf and one NaN.
  const int64_t C = 1200;
  Tensor x = randn({2, C});
  x.narrow(0, 0, 1).narrow(1, 0, 512).fill_(std::nan(""));
  x.narrow(0, 1, 1).narrow(1, 0, 600).fill_(-std::numeric_limits<double>::infinity());
  x.narrow(0, 1, 1).narrow(1, 7, 1).fill_(std::nan(""));
  for (int64_t row = 0; row < 2; ++row) {
    Tensor xr = x.narrow(0, row, 1).clone();
    for (DType dt : {DType::f32, DType::f64}) {
      Tensor a = xr.to(dt).detach().set_requires_grad(true);
      Tensor loss = cross_entropy(a, from_vector<int64_t>({1000}, {1}));
      CHECK(std::isnan(loss.item<double>()));
      loss.backward();
      CHECK(std::isnan(a.grad().to(DType::f64).to_vector<double>()[1000]));
    }
  }
}
