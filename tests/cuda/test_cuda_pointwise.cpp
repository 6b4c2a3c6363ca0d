// CUDA pointwise kernels (tensor/ops/cuda/pointwise_*.cu) against the CPU backend: unary,
// scalar and binary ops with broadcasting, comparisons, where, in-place add_ / mul_; f32 and
// bf16; sizes 1, 7, 1031; non-contiguous (transposed, sliced) inputs; forward and backward.
#include "cuda_test_util.h"
#include "tensor/ops/nn_swiglu.h"
#include "tensor/dispatch.h"

using namespace dtr;
using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

namespace {

// Backward of a bf16 op chains several bf16-rounded ops (e.g. silu: sigmoid, rsub, mul, add),
// and CPU / GPU float results may straddle a rounding boundary at any of them: allow ~3 ulps.
constexpr double kBf16ChainTol = 3e-2;

double tol(DType dt, bool chain = false) {
  if (chain && dt == DType::bf16) return kBf16ChainTol;
  return testing::atol_for(dt);
}

Tensor leaf(const Shape& shape, DType dt, double lo = -2.0, double hi = 2.0) {
  return uniform(shape, lo, hi, TensorOptions(DType::f32)).to(dt).set_requires_grad(true);
}

Fn one(Tensor (*f)(const Tensor&)) {
  return [f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; };
}

}  // namespace

TEST_CASE("cuda unary ops match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Shape& shape : {Shape{1}, Shape{7}, Shape{1031}, Shape{7, 33}}) {
      INFO("dtype " << dt << " shape " << detail::cat(shape));
      const Tensor x = leaf(shape, dt);
      const Tensor xp = leaf(shape, dt, 0.5, 3.0);  // log / sqrt / rsqrt / pow domain
      using U = Tensor (*)(const Tensor&);
      for (U f : std::vector<U>{&dtr::neg, &dtr::exp, &dtr::sigmoid, &dtr::tanh, &dtr::relu, &dtr::silu, &dtr::abs})
        testing::check_cuda_matches_cpu(one(f), {x}, tol(dt, true), tol(dt, true));
      for (U f : std::vector<U>{&dtr::log, &dtr::sqrt, &dtr::rsqrt})
        testing::check_cuda_matches_cpu(one(f), {xp}, tol(dt, true), tol(dt, true));
      for (bool approx : {false, true})
        testing::check_cuda_matches_cpu(
            [approx](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0], approx)}; }, {x},
            tol(dt, true), tol(dt, true));
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) {
            const Tensor& a = in[0];
            return std::vector<Tensor>{add(a, 1.5), sub(a, 0.25), mul(a, -3.0), div(a, 7.0), rsub(a, 2.0)};
          },
          {x}, tol(dt), tol(dt));
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{pow(in[0], 2.5), pow(in[0], -1.0)}; }, {xp},
          tol(dt, true), tol(dt, true));
    }
  }
}

TEST_CASE("cuda unary ops on non-contiguous inputs", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    const Tensor x = leaf({33, 7}, dt);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          const Tensor t = in[0].transpose(0, 1);            // [7, 33], strides (1, 7)
          const Tensor s = slice(in[0], 0, 1, 33, 3);         // every third row
          return std::vector<Tensor>{exp(t), silu(s), mul(t, 2.0)};
        },
        {x}, tol(dt, true), tol(dt, true));
  }
}

TEST_CASE("cuda binary ops with broadcasting match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {{{1031}, {1031}}, {{7, 1031}, {1031}}, {{7, 1}, {1, 33}}, {{1}, {7, 5}},
                                   {{3, 1, 5}, {4, 1}}, {{1}, {1}}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : cases) {
      INFO("dtype " << dt << " a " << detail::cat(c.a) << " b " << detail::cat(c.b));
      const Tensor a = leaf(c.a, dt), b = leaf(c.b, dt, 0.5, 2.0);  // b > 0: division
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{add(in[0], in[1]), sub(in[0], in[1]), mul(in[0], in[1]), div(in[0], in[1]),
                                       maximum(in[0], in[1])};
          },
          {a, b}, tol(dt, true), tol(dt, true));
    }
    INFO("dtype " << dt << " non-contiguous operands");
    const Tensor a = leaf({33, 7}, dt), b = leaf({7, 33}, dt);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          const Tensor at = in[0].transpose(0, 1);
          return std::vector<Tensor>{add(at, in[1]), mul(at, narrow(in[1], 1, 0, 1))};
        },
        {a, b}, tol(dt, true), tol(dt, true));
  }
}

TEST_CASE("cuda comparisons, where and masked_fill match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    // Values on a coarse grid so that eq has true cases and the maximum has ties.
    const Tensor a = mul(to_dtype(to_dtype(uniform({7, 1031}, -3, 3), DType::i64), DType::f32), 0.5)
                         .to(dt)
                         .set_requires_grad(true);
    const Tensor b = mul(to_dtype(to_dtype(uniform({1031}, -3, 3), DType::i64), DType::f32), 0.5)
                         .to(dt)
                         .set_requires_grad(true);
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{eq(in[0], in[1]), gt(in[0], 0.25), lt(in[0], -0.5),
                                     where(gt(in[1], 0.0), in[0], in[1]), masked_fill(in[0], lt(in[1], 0.0), -1e4),
                                     maximum(in[0], in[1])};
        },
        {a, b}, tol(dt), tol(dt));
  }
}

TEST_CASE("cuda integer pointwise ops are exact", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Tensor a = to_dtype(uniform({7, 33}, -50, 50), DType::i64);
  const Tensor b = to_dtype(uniform({33}, -5, 5), DType::i64);  // contains zeros: div gives 0
  testing::check_cuda_matches_cpu(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{add(in[0], in[1]), sub(in[0], in[1]), mul(in[0], in[1]), div(in[0], in[1]),
                                   maximum(in[0], in[1]), eq(in[0], in[1]), gt(in[0], 3.0),
                                   sum(in[0], {1}), amax(in[0], {0})};
      },
      {a, b}, 0.0, 0.0, false);
  const Tensor a32 = to_dtype(a, DType::i32), b32 = to_dtype(b, DType::i32);
  testing::check_cuda_matches_cpu(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{add(in[0], in[1]), div(in[0], in[1])}; },
      {a32, b32}, 0.0, 0.0, false);
}

TEST_CASE("cuda in-place add_ and mul_ match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Tensor x = uniform({7, 1031}, -1, 1), y = uniform({1031}, -1, 1);
  Tensor xc = x.clone(), xg = x.to(testing::cuda_device());
  add_(xc, y, 0.5);
  add_(xg, y.to(testing::cuda_device()), 0.5);
  mul_(xc, -1.25);
  mul_(xg, -1.25);
  CHECK(testing::compare_with_cpu(xg, xc, 1e-6, 1e-6, "add_/mul_") == "");
  // Non-contiguous destination: the transposed view is updated in place.
  Tensor base_c = uniform({33, 7}, -1, 1);
  Tensor base_g = base_c.to(testing::cuda_device());
  Tensor tc = base_c.transpose(0, 1), tg = base_g.transpose(0, 1);
  const Tensor z = uniform({7, 1}, -1, 1);
  add_(tc, z, 2.0);
  add_(tg, z.to(testing::cuda_device()), 2.0);
  CHECK(testing::compare_with_cpu(base_g, base_c, 1e-6, 1e-6, "add_ into a transposed view") == "");
  // bf16 on CUDA (the CPU kernel of add_ is f32 / f64 only): compare with the f32 CPU result.
  Tensor xb = x.to(DType::bf16).to(testing::cuda_device());
  add_(xb, y.to(DType::bf16).to(testing::cuda_device()), 1.0);
  Tensor ref = x.to(DType::bf16).to(DType::f32);
  add_(ref, y.to(DType::bf16).to(DType::f32), 1.0);
  CHECK(testing::compare_with_cpu(xb.to(DType::f32), ref.to(DType::bf16).to(DType::f32), 1e-2, 1e-2, "bf16 add_") ==
        "");
}

TEST_CASE("cuda silu_backward matches the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  // The silu front-end uses the fused op on CPU f32 only; the CUDA kernel is checked directly.
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    const Tensor g = uniform({7, 1031}, -1, 1).to(dt), x = uniform({7, 1031}, -4, 4).to(dt);
    const Tensor cpu = dispatch1(OpCall{op_def("silu_backward"), {g, x}, {}});
    const Tensor gpu = dispatch1(
        OpCall{op_def("silu_backward"), {g.to(testing::cuda_device()), x.to(testing::cuda_device())}, {}});
    CHECK(testing::compare_with_cpu(gpu, cpu, tol(dt), tol(dt), "silu_backward") == "");
  }
}

TEST_CASE("cuda swiglu and swiglu_backward match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Shape& shape : {Shape{1}, Shape{1031}, Shape{7, 33}}) {
      INFO("dtype " << dt << " shape " << detail::cat(shape));
      // forward and both input gradients through autograd (one fused op each way)
      testing::check_cuda_matches_cpu(
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{swiglu(in[0], in[1])}; },
          {leaf(shape, dt, -6.0, 6.0), leaf(shape, dt)}, tol(dt, true), tol(dt, true));
    }
    // the backward op directly, on a transposed (non-contiguous) gate and large |gate|
    const Tensor g = uniform({7, 1031}, -1, 1).to(dt), u = uniform({7, 1031}, -2, 2).to(dt);
    const Tensor x = uniform({1031, 7}, -90, 90).to(dt).transpose(0, 1);
    const auto cpu = dispatch(OpCall{op_def("swiglu_backward"), {g, x, u}, {}});
    const auto dev = testing::cuda_device();
    const auto gpu = dispatch(OpCall{op_def("swiglu_backward"), {g.to(dev), x.to(dev), u.to(dev)}, {}});
    CHECK(testing::compare_with_cpu(gpu[0], cpu[0], tol(dt), tol(dt), "swiglu_backward dgate") == "");
    CHECK(testing::compare_with_cpu(gpu[1], cpu[1], tol(dt), tol(dt), "swiglu_backward dup") == "");
    // the joined form swiglu(gate_up) (MoE experts): forward on the halves, swiglu_joined_backward
    testing::check_cuda_matches_cpu([](const std::vector<Tensor>& in) { return std::vector<Tensor>{swiglu(in[0])}; },
                                    {leaf({5, 2, 66}, dt, -6.0, 6.0)}, tol(dt, true), tol(dt, true));
    // the weighted joined form (rows scaled by the MoE routing weights; rows of 300 > one block's
    // threads in the weight gradient's row sum)
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{swiglu_weighted(in[0], in[1])}; },
        {leaf({5, 2, 66}, dt, -6.0, 6.0), leaf({5, 2}, dt)}, tol(dt, true), tol(dt, true));
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{swiglu_weighted(in[0], in[1])}; },
        {leaf({9, 600}, dt, -6.0, 6.0), leaf({9}, dt)}, tol(dt, true), tol(dt, true));
  }
}
