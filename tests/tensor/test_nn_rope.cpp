// rope_tables and rotary_embedding (HF rotate-half): hand-checked tables, the rotation
// preserves pair norms, relative-position property, backward against finite differences
// (x, and cos/sin when they require grad), broadcasting tables, non-contiguous x (the output in
// x's memory order when x is dense).
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "tensor/dispatch.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;

namespace {
Tensor leaf(const Shape& s) { return uniform(s, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true); }
}  // namespace

TEST_CASE("rope_tables hand-checked", "[rope]") {
  auto [c, s] = rope_tables(3, 4, 100.0, 2, DType::f64);
  REQUIRE(c.sizes() == Shape{3, 4});
  auto cv = c.to_vector<double>(), sv = s.to_vector<double>();
  // position 2 + t, inv_freq = {1, 100^(-1/2) = 0.1}; emb = cat(freqs, freqs)
  CHECK(cv[0] == Approx(std::cos(2.0)));
  CHECK(cv[1] == Approx(std::cos(0.2)));
  CHECK(cv[2] == Approx(std::cos(2.0)));
  CHECK(sv[4 + 3] == Approx(std::sin(0.3)));
  CHECK(rope_tables(2, 4, 1e4, 0, DType::bf16).first.dtype() == DType::bf16);
  CHECK_THROWS_WITH(rope_tables(2, 3, 1e4, 0), Catch::Contains("even"));
}

TEST_CASE("rotary_embedding forward", "[rope]") {
  // D = 2: out = (x0 c - x1 s, x1 c + x0 s), a plain rotation by angle pos * 1
  auto [c, s] = rope_tables(2, 2, 10000.0, 0, DType::f64);
  Tensor x = from_vector<double>({1, 0, 1, 0}, {1, 1, 2, 2});
  auto y = rotary_embedding(x, c, s).to_vector<double>();
  CHECK(y[0] == Approx(1.0));
  CHECK(y[1] == Approx(0.0).margin(1e-15));
  CHECK(y[2] == Approx(std::cos(1.0)));
  CHECK(y[3] == Approx(std::sin(1.0)));
  // q.k after rotation depends only on the position difference
  manual_seed(2);
  Tensor q = randn({1, 1, 1, 8}, DType::f64), k = randn({1, 1, 1, 8}, DType::f64);
  auto dot_at = [&](int64_t pq, int64_t pk) {
    auto [cq, sq] = rope_tables(1, 8, 10000.0, pq, DType::f64);
    auto [ck, sk] = rope_tables(1, 8, 10000.0, pk, DType::f64);
    return sum(mul(rotary_embedding(q, cq, sq), rotary_embedding(k, ck, sk))).item<double>();
  };
  CHECK(dot_at(7, 3) == Approx(dot_at(14, 10)));
  CHECK_THROWS_WITH(rotary_embedding(zeros({1, 1, 2, 4}), zeros({3, 4}), zeros({3, 4})),
                    Catch::Contains("broadcast"));
}

TEST_CASE("rotary_embedding backward matches finite differences", "[rope][grad]") {
  manual_seed(8);
  auto [c, s] = rope_tables(3, 6, 10000.0, 1, DType::f64);
  auto fx = [c, s](const std::vector<Tensor>& v) { return rotary_embedding(v[0], c, s); };
  CHECK(gradcheck(fx, {leaf({2, 2, 3, 6})}) == "");
  CHECK(gradcheck([c, s](const std::vector<Tensor>& v) { return rotary_embedding(v[0].transpose(1, 2), c, s); },
                  {leaf({1, 3, 2, 6})}) == "");
  CHECK(gradcheck(fx, {leaf({0, 2, 3, 6})}) == "");
  // general (non-table) cos/sin, broadcast [B, 1, T, D], all inputs require grad
  CHECK(gradcheck([](const std::vector<Tensor>& v) { return rotary_embedding(v[0], v[1], v[2]); },
                  {leaf({2, 3, 4, 4}), leaf({2, 1, 4, 4}), leaf({2, 1, 4, 4})}) == "");
}

TEST_CASE("rotary_embedding f32 kernel equals the rotate-half formula in f64", "[rope]") {
  // The f32 fast path (unit-stride tables, odometer row offsets) on the layouts the model uses:
  // q / k as [B, T, H, D] transposed to [B, H, T, D], tables [T, D] and [B, 1, T, D], and a
  // table with a non-unit last stride (the general loop), rows not a multiple of the chunk.
  manual_seed(21);
  const int64_t B = 2, T = 37, H = 5, D = 12, h = D / 2;
  auto rot = [h](const Tensor& u) { return cat({neg(narrow(u, -1, h, h)), narrow(u, -1, 0, h)}, -1); };
  auto rot_t = [h](const Tensor& u) { return cat({narrow(u, -1, h, h), neg(narrow(u, -1, 0, h))}, -1); };
  auto [c64, s64] = rope_tables(T, D, 10000.0, 3, DType::f64);
  Tensor cb = uniform({B, 1, T, D}, -1, 1, TensorOptions(DType::f64)), sb = uniform({B, 1, T, D}, -1, 1, TensorOptions(DType::f64));
  Tensor wide = uniform({T, 2 * D}, -1, 1, TensorOptions(DType::f64));
  Tensor cw = narrow(wide.view({T, D, 2}), -1, 0, 1).view({T, D});  // last stride 2
  std::vector<std::pair<Tensor, Tensor>> tables{{c64, s64}, {cb, sb}, {cw, s64}};
  for (const auto& [c, s] : tables)
    for (bool dense : {true, false}) {
      // dense: the output keeps x's [B, T, H, D] memory order; not dense (rows of a wider
      // tensor): contiguous output
      Tensor x32 = dense ? uniform({B, T, H, D}, -2, 2).transpose(1, 2)
                         : narrow(uniform({B, T, H, 2 * D}, -2, 2), -1, 0, D).transpose(1, 2);
      REQUIRE(!x32.is_contiguous());
      const Tensor x = x32.to(DType::f64), c32 = c.to(DType::f32), s32 = s.to(DType::f32);
      Tensor y = rotary_embedding(x32, c32, s32);
      CHECK((dense ? transpose(y, 1, 2) : y).is_contiguous());
      Tensor ref = add(mul(x, c), mul(rot(x), s));
      CHECK(amax(abs(sub(y.to(DType::f64), ref))).item<double>() < 1e-5);
      static const OpDef* bw = op_def("rotary_embedding_backward");
      Tensor dx = dispatch1(OpCall{bw, {x32, c32, s32}, {}});
      CHECK((dense ? transpose(dx, 1, 2) : dx).is_contiguous());
      Tensor dref = add(mul(x, c), rot_t(mul(x, s)));
      CHECK(amax(abs(sub(dx.to(DType::f64), dref))).item<double>() < 1e-5);
    }
}
