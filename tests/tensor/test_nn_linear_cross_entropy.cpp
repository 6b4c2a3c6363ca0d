// linear_cross_entropy against the unfused linear + cross_entropy in f64 (loss and the
// gradients of input and weight, ignore_index, chunk sizes that do not divide N, every target
// ignored, a frozen weight, upstream gradients != 1; f32 with the weight gradient accumulated by
// the SGEMM), finite differences, bf16 in f32
// arithmetic, no graph under no_grad, errors; the one-pass loss + gradient kernel
// (cross_entropy_loss_and_grad_) against cross_entropy and its backward, for 1 and 2 threads.
#include <catch2/catch.hpp>

#include <omp.h>

#include <limits>

#include "gradcheck.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/dispatch.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {

struct Result {
  double loss;
  Tensor dx, dw;
};

/// Loss and gradients of 1.5 * f(x, w) for fresh leaves equal to x and w.
template <class F>
Result run(F f, const Tensor& x, const Tensor& w, bool grad_w = true) {
  Tensor a = x.clone().set_requires_grad(true), b = w.clone().set_requires_grad(grad_w);
  Tensor loss = f(a, b);
  mul(loss, 1.5).backward();
  return {loss.to(DType::f64).item<double>(), a.grad(), grad_w ? b.grad() : Tensor()};
}

Tensor targets_with_ignored(int64_t N, int64_t V) {
  std::vector<int64_t> t(N);
  for (int64_t i = 0; i < N; ++i) t[i] = i % 4 == 1 ? -100 : (i * 7 + 3) % V;
  return from_vector<int64_t>(t, {N});
}

}  // namespace

TEST_CASE("linear_cross_entropy equals linear + cross_entropy in f64", "[loss][fused]") {
  manual_seed(24);
  const int64_t N = 13, H = 6, V = 11;
  Tensor x = randn({N, H}, DType::f64), w = randn({V, H}, DType::f64);
  Tensor t = targets_with_ignored(N, V);
  const Result ref = run([&](const Tensor& a, const Tensor& b) { return cross_entropy(linear(a, b), t); }, x, w);
  for (int64_t chunk : {0, 1, 4, 5, 13, 100}) {  // 4, 5 do not divide 13
    INFO("chunk " << chunk);
    const Result r =
        run([&](const Tensor& a, const Tensor& b) { return linear_cross_entropy(a, b, t, -100, chunk); }, x, w);
    CHECK(r.loss == Approx(ref.loss).epsilon(1e-13));
    CHECK(max_abs_diff(r.dx, ref.dx) < 1e-13);
    CHECK(max_abs_diff(r.dw, ref.dw) < 1e-13);
  }
  // f32 through dtr's SGEMM: three chunks (16, 16, 8 rows), the later two weight-gradient terms
  // accumulated in place by the GEMM (addmm_), over a vocabulary of 3000 rows; against the
  // unfused head in f64 on the same values.
  const int64_t Nb = 40, Hb = 64, Vb = 3000;
  Tensor xb = randn({Nb, Hb}), wb = mul(randn({Vb, Hb}), 0.1);
  Tensor tb = targets_with_ignored(Nb, Vb);
  const Result rb = run([&](const Tensor& a, const Tensor& b) { return cross_entropy(linear(a, b), tb); },
                        xb.to(DType::f64), wb.to(DType::f64));
  const Result fb =
      run([&](const Tensor& a, const Tensor& b) { return linear_cross_entropy(a, b, tb, -100, 16); }, xb, wb);
  REQUIRE(fb.dw.dtype() == DType::f32);
  CHECK(fb.loss == Approx(rb.loss).epsilon(1e-6));
  CHECK(max_abs_diff(fb.dx.to(DType::f64), rb.dx) < 1e-6);
  CHECK(max_abs_diff(fb.dw.to(DType::f64), rb.dw) < 1e-6);
  // Another ignore_index; a frozen weight gets no gradient and the input's is unchanged.
  Tensor t7 = from_vector<int64_t>({7, 1, 7, 0, 10, 2, 7, 3, 4, 5, 6, 8, 9}, {N});
  const Result r7 = run([&](const Tensor& a, const Tensor& b) { return cross_entropy(linear(a, b), t7, 7); }, x, w);
  const Result f7 = run([&](const Tensor& a, const Tensor& b) { return linear_cross_entropy(a, b, t7, 7, 3); }, x, w,
                        /*grad_w=*/false);
  CHECK(f7.loss == Approx(r7.loss).epsilon(1e-13));
  CHECK(max_abs_diff(f7.dx, r7.dx) < 1e-13);
}

TEST_CASE("linear_cross_entropy with every target ignored is 0 with zero gradients", "[loss][fused]") {
  Tensor x = randn({5, 3}, DType::f64), w = randn({4, 3}, DType::f64);
  Tensor t = full({5}, -100.0, TensorOptions(DType::i64));
  const Result r = run([&](const Tensor& a, const Tensor& b) { return linear_cross_entropy(a, b, t, -100, 2); }, x, w);
  CHECK(r.loss == 0.0);
  CHECK(max_abs_diff(r.dx, zeros_like(x)) == 0.0);
  CHECK(max_abs_diff(r.dw, zeros_like(w)) == 0.0);
  CHECK(linear_cross_entropy(zeros({0, 3}, DType::f64), w, zeros({0}, DType::i64)).item<double>() == 0.0);
}

TEST_CASE("linear_cross_entropy backward matches finite differences", "[loss][fused][grad]") {
  manual_seed(25);
  Tensor x = uniform({7, 4}, -2, 2, TensorOptions(DType::f64)).set_requires_grad(true);
  Tensor w = uniform({9, 4}, -2, 2, TensorOptions(DType::f64)).set_requires_grad(true);
  Tensor t = from_vector<int32_t>({3, -100, 0, 8, 2, -100, 5}, {7});
  CHECK(gradcheck([t](const std::vector<Tensor>& v) { return linear_cross_entropy(v[0], v[1], t, -100, 3); },
                  {x, w}) == "");
}

TEST_CASE("linear_cross_entropy in bf16 computes in f32", "[loss][fused][lowp]") {
  manual_seed(26);
  const int64_t N = 24, H = 16, V = 300;
  Tensor x = to_dtype(randn({N, H}), DType::bf16), w = to_dtype(mul(randn({V, H}), 0.5), DType::bf16);
  Tensor t = targets_with_ignored(N, V);
  // Reference: the same bf16 values in f64.
  const Result ref = run([&](const Tensor& a, const Tensor& b) { return cross_entropy(linear(a, b), t); },
                         to_dtype(x, DType::f64), to_dtype(w, DType::f64));
  const Result r =
      run([&](const Tensor& a, const Tensor& b) { return linear_cross_entropy(a, b, t, -100, 7); }, x, w);
  CHECK(r.dx.dtype() == DType::bf16);
  CHECK(r.dw.dtype() == DType::bf16);
  CHECK(r.loss == Approx(ref.loss).epsilon(1e-2));  // the loss is rounded to bf16 at the end
  CHECK(max_abs_diff(to_dtype(r.dx, DType::f64), ref.dx) < 2e-3);
  CHECK(max_abs_diff(to_dtype(r.dw, DType::f64), ref.dw) < 2e-3);
}

TEST_CASE("linear_cross_entropy records no graph without grad and checks its input", "[loss][fused]") {
  Tensor x = randn({4, 3}).set_requires_grad(true), w = randn({5, 3});
  Tensor t = from_vector<int64_t>({0, 4, -100, 2}, {4});
  {
    NoGradGuard ng;
    Tensor l = linear_cross_entropy(x, w, t);
    CHECK_FALSE(l.requires_grad());
    CHECK(l.item<double>() == Approx(cross_entropy(linear(x, w), t).item<double>()).epsilon(1e-6));
  }
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, from_vector<int64_t>({0, 5, 1, 1}, {4})),
                    Catch::Contains("target 5"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, randn({5, 2}), t), Catch::Contains("weight must be [V, H]"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, zeros({3}, DType::i64)), Catch::Contains("targets must be [N]"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, to_dtype(w, DType::f64), t), Catch::Contains("dtype"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, t, -100, -1), Catch::Contains("chunk_size"));
}

TEST_CASE("cross_entropy_loss_and_grad_ equals cross_entropy and its backward, for any thread count",
          "[loss][fused]") {
  manual_seed(27);
  static const OpDef* fused = op_def("cross_entropy_loss_and_grad_");
  static const OpDef* bw = op_def("cross_entropy_backward");
  // 1300 columns: two full blocks of the online sum and a partial one; a row whose maximum sits
  // in its last block (the running max moves late); ignored rows; a masked (-inf) logit.
  const int64_t N = 9, C = 1300;
  Tensor t = targets_with_ignored(N, C);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dt);
    std::vector<double> v = mul(randn({N, C}, DType::f64), 3.0).to_vector<double>();
    v[2 * C + C - 5] = 40.0;
    v[3 * C + 10] = -std::numeric_limits<double>::infinity();
    const Tensor x = to_dtype(from_vector<double>(v, {N, C}), dt);
    const Tensor g = full({}, 0.75, TensorOptions(dt));
    const double count = 7;  // rows 1 and 5 are ignored
    const double ref_loss = cross_entropy(x, t).to(DType::f64).item<double>() * count;
    const Tensor ref_grad = dispatch1(OpCall{bw, {g, x, t}, {int64_t{-100}}});
    std::vector<Tensor> outs;
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      Tensor l = x.clone();
      std::vector<Tensor> r = dispatch(OpCall{fused, {g, l, t}, {int64_t{-100}}});
      REQUIRE(r[0].dtype() == DType::f64);
      CHECK(r[1].data_ptr() == l.data_ptr());  // in place
      CHECK(r[0].item<double>() == Approx(ref_loss).epsilon(dt == DType::f32 ? 1e-6 : 1e-14));
      CHECK(max_abs_diff(r[1], ref_grad) == 0.0);  // the backward's own arithmetic
      outs.push_back(r[0]);
    }
    omp_set_num_threads(2);
    CHECK(outs[0].item<double>() == outs[1].item<double>());
  }
  CHECK_THROWS_WITH(dispatch(OpCall{fused, {full({}, 1.0), randn({4, 3}).t(), zeros({3}, DType::i64)},
                                    {int64_t{-100}}}),
                    Catch::Contains("contiguous"));
}
