// moe_permute / moe_unpermute (tensor/ops/moe_permute.h; weighted and unweighted) in f64 against
// the composition they replace (embedding gather, broadcast mul, sum over k; embedding_backward's
// scatter-add), with
// gradients by finite differences; f32 equal to the composition within rounding; a routing
// where one expert takes most copies and others none; the kernels bit-equal on 1-3 threads; bad
// slot positions.
#include <catch2/catch.hpp>

#include <limits>

#include "gradcheck.h"
#include "tensor/ops.h"
#include "tensor/ops/moe_permute.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {

/// A routing of N tokens to k of E experts (expert of slot s = e_of(s)), sorted stably by expert.
struct Perm {
  Tensor sorted_token, slot_position;
};
Perm make_perm(int64_t N, int64_t k, int64_t E, const std::function<int64_t(int64_t)>& e_of) {
  std::vector<int64_t> counts(E, 0), next(E, 0), sorted(N * k), pos(N * k);
  for (int64_t s = 0; s < N * k; ++s) ++counts[e_of(s)];
  for (int64_t e = 1; e < E; ++e) next[e] = next[e - 1] + counts[e - 1];
  for (int64_t s = 0; s < N * k; ++s) {
    const int64_t p = next[e_of(s)]++;
    sorted[p] = s / k;
    pos[s] = p;
  }
  return {from_vector<int64_t>(sorted, {N * k}), from_vector<int64_t>(pos, {N * k})};
}

/// The composition moe_unpermute replaces.
Tensor unpermute_ref(const Tensor& ys, const Tensor& pos, const Tensor& probs) {
  const int64_t N = probs.size(0), k = probs.size(1), H = ys.size(1);
  return sum(mul(reshape(embedding(pos, ys), {N, k, H}), unsqueeze(probs, 2)), {1});
}
/// The unweighted moe_unpermute as a composition: gather to (token, slot) order, sum over k.
Tensor unpermute_sum_ref(const Tensor& ys, const Tensor& pos, int64_t k) {
  return sum(reshape(embedding(pos, ys), {ys.size(0) / k, k, ys.size(1)}), {1});
}

}  // namespace

TEST_CASE("moe_permute / moe_unpermute equal the gather + mul + sum composition (f64, gradients)", "[moe]") {
  const int64_t N = 7, k = 3, E = 5, H = 6;
  // Skewed: expert 1 takes most copies, expert 3 none.
  const Perm p = make_perm(N, k, E, [](int64_t s) { return s % 4 == 3 ? (s % 5 == 3 ? 1 : 4) : (s % 4 == 0 ? 1 : s % 4 == 1 ? 0 : 2); });
  Tensor x = uniform({N, H}, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true);
  Tensor ys = uniform({N * k, H}, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true);
  Tensor probs = uniform({N, k}, 0, 1, TensorOptions(DType::f64)).set_requires_grad(true);

  CHECK(max_abs_diff(moe_permute(x, p.slot_position, k), embedding(p.sorted_token, x)) == 0);
  CHECK(max_abs_diff(moe_unpermute(ys, p.slot_position, probs), unpermute_ref(ys, p.slot_position, probs)) < 1e-15);

  // Gradients against the composition's and by finite differences.
  const Tensor w = uniform({N * k, H}, -1, 1, TensorOptions(DType::f64));
  sum(mul(moe_permute(x, p.slot_position, k), w)).backward();
  const Tensor gx = x.grad();
  x.set_grad(Tensor());
  sum(mul(embedding(p.sorted_token, x), w)).backward();
  CHECK(max_abs_diff(gx, x.grad()) < 1e-15);
  const Tensor w2 = uniform({N, H}, -1, 1, TensorOptions(DType::f64));
  sum(mul(moe_unpermute(ys, p.slot_position, probs), w2)).backward();
  const Tensor gys = ys.grad(), gp = probs.grad();
  ys.set_grad(Tensor());
  probs.set_grad(Tensor());
  sum(mul(unpermute_ref(ys, p.slot_position, probs), w2)).backward();
  CHECK(max_abs_diff(gys, ys.grad()) < 1e-15);
  CHECK(max_abs_diff(gp, probs.grad()) < 1e-14);

  CHECK(gradcheck([&](const std::vector<Tensor>& in) { return moe_permute(in[0], p.slot_position, k); },
                  {x.detach().set_requires_grad(true)}) == "");
  CHECK(gradcheck([&](const std::vector<Tensor>& in) { return moe_unpermute(in[0], p.slot_position, in[1]); },
                  {ys.detach().set_requires_grad(true), probs.detach().set_requires_grad(true)}) == "");

  // The unweighted form: the transpose of moe_permute.
  CHECK(max_abs_diff(moe_unpermute(ys, p.slot_position, k), unpermute_sum_ref(ys, p.slot_position, k)) < 1e-15);
  ys.set_grad(Tensor());
  sum(mul(moe_unpermute(ys, p.slot_position, k), w2)).backward();
  const Tensor gys_sum = ys.grad();
  ys.set_grad(Tensor());
  sum(mul(unpermute_sum_ref(ys, p.slot_position, k), w2)).backward();
  CHECK(max_abs_diff(gys_sum, ys.grad()) == 0);
  CHECK(gradcheck([&](const std::vector<Tensor>& in) { return moe_unpermute(in[0], p.slot_position, k); },
                  {ys.detach().set_requires_grad(true)}) == "");
}

TEST_CASE("moe_unpermute in f32 on a layer-sized routing equals the composition within rounding", "[moe]") {
  const int64_t N = 300, k = 4, E = 16, H = 64;  // above the parallel grain: OpenMP over tokens
  const Perm p = make_perm(N, k, E, [](int64_t s) { return (s * 7 + s / 4) % 16; });
  const Tensor ys = randn({N * k, H}), probs = uniform({N, k}, 0, 1);
  CHECK(max_abs_diff(moe_unpermute(ys, p.slot_position, probs), unpermute_ref(ys, p.slot_position, probs)) < 1e-5);
}

TEST_CASE("moe_permute kernels on 2 and 3 threads bit-equal to 1 thread (dynamic chunks of tokens)", "[moe]") {
  // 1100 tokens: 17 full chunks of 64 and a partial one; outputs > 1 MiB (cached blocks) are
  // poisoned with NaN before each call, so a token no thread computed shows
  const int64_t N = 1100, k = 4, E = 16, H = 256;
  const Perm p = make_perm(N, k, E, [](int64_t s) { return s % 5 == 0 ? 3 : (s * 7 + s / 4) % 16; });
  manual_seed(9);
  const Tensor ys = randn({N * k, H}), probs = uniform({N, k}, 0, 1), g = randn({N, H}), gs = randn({N * k, H});
  auto poison = [&] {
    for (const Shape& shape : {Shape{N * k, H}, Shape{N, H}})
      (void)full(shape, std::numeric_limits<double>::quiet_NaN());
  };
  auto run = [&] {
    std::vector<Tensor> out;
    poison();
    out.push_back(moe_unpermute(ys, p.slot_position, probs));
    Tensor y = ys.detach().clone().set_requires_grad(true), pr = probs.detach().clone().set_requires_grad(true);
    Tensor loss = sum(mul(moe_unpermute(y, p.slot_position, pr), g));
    poison();
    loss.backward();
    out.push_back(y.grad());
    out.push_back(pr.grad());
    Tensor x = g.detach().clone().set_requires_grad(true);
    loss = sum(mul(moe_permute(x, p.slot_position, k), gs));
    poison();
    out.push_back(moe_permute(g, p.slot_position, k));
    loss.backward();
    out.push_back(x.grad());
    Tensor y2 = ys.detach().clone().set_requires_grad(true);
    poison();
    loss = sum(mul(moe_unpermute(y2, p.slot_position, k), g));
    out.push_back(loss.detach());
    poison();
    loss.backward();
    out.push_back(y2.grad());
    return out;
  };
  CHECK(dtr::testing::same_bits_on_threads(run) == "");
}

TEST_CASE("moe_permute of a layer-sized f32 input (non-temporal stores) equals the gather", "[moe]") {
  // out [8400, 256] f32 = 8.6 MB: the streamed path; rows of 256 floats, and of 250 (rows not
  // 64-byte aligned: plain head and tail stores around the streamed middle).
  for (int64_t H : {256, 250}) {
    INFO("H " << H);
    const int64_t N = 2100, k = 4, E = 16;
    const Perm p = make_perm(N, k, E, [](int64_t s) { return s % 7 == 0 ? 2 : (s * 5 + s / 4) % 16; });
    const Tensor x = randn({N, H});
    CHECK(max_abs_diff(moe_permute(x, p.slot_position, k), embedding(p.sorted_token, x)) == 0);
    CHECK(dtr::testing::same_bits_on_threads([&] { return std::vector<Tensor>{moe_permute(x, p.slot_position, k)}; }) ==
          "");
  }
}

TEST_CASE("moe_permute / moe_unpermute reject bad slot positions", "[moe]") {
  const Tensor ys = randn({4, 3}), probs = uniform({2, 2}, 0, 1);
  CHECK_THROWS_WITH(moe_unpermute(ys, from_vector<int64_t>({0, 1, 1, 3}, {4}), probs),
                    Catch::Contains("expected a permutation"));
  CHECK_THROWS_WITH(moe_unpermute(ys, from_vector<int64_t>({0, 1, 2, 4}, {4}), probs), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(moe_unpermute(ys, from_vector<int64_t>({0, 1, 2}, {3}), probs), Catch::Contains("slot_position"));
  CHECK_THROWS_WITH(moe_permute(randn({2, 3}), from_vector<int64_t>({0, 1}, {2}), 2), Catch::Contains("slot_position"));
  CHECK_THROWS_WITH(moe_permute(randn({2, 3}), from_vector<int64_t>({0, 1, 3, 3}, {4}), 2),
                    Catch::Contains("expected a permutation"));
  CHECK_THROWS_WITH(moe_unpermute(ys, from_vector<int64_t>({0, 1, 2, 2}, {4}), 2), Catch::Contains("expected a permutation"));
  CHECK_THROWS_WITH(moe_unpermute(randn({3, 3}), from_vector<int64_t>({0, 1, 2}, {3}), 2), Catch::Contains("k=2"));
}

TEST_CASE("moe_unpermute rejects probs with no expert per token", "[moe]") {
  // probs [N, 0] with ys [0, H] passed the numel check and the kernel read slot 0 of an empty
  // slot_position.
  CHECK_THROWS_WITH(moe_unpermute(randn({0, 4}), from_vector<int64_t>({}, {0}), randn({3, 0})),
                    Catch::Contains("probs [3, 0]"));
}
