// MoE block (tensor/nn/moe.h) in f64 against a dense reference that loops over tokens and their
// top-k experts with plain mm / silu / mul (softmax and sigmoid scores, with and without top-k
// renormalisation, shared expert with its sigmoid gate, skewed routing where one expert takes
// every token and others none); gradients of every parameter and the input by finite
// differences; the load-balancing and z losses against their formulas; bf16; errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gradcheck.h"
#include "tensor/autograd/checkpoint.h"
#include "tensor/nn/moe.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {
// f64: the same products and sums in another order (grouped GEMM vs per-token mm).
constexpr double kF64Tol = 1e-12;

nn::MoEConfig config(int64_t E = 4, int64_t k = 2, bool norm = true, const std::string& score = "softmax") {
  nn::MoEConfig c;
  c.hidden_size = 6;
  c.moe_intermediate_size = 5;
  c.num_experts = E;
  c.num_experts_per_tok = k;
  c.norm_topk_prob = norm;
  c.score_func = score;
  return c;
}

std::shared_ptr<nn::MoE> make_moe(const nn::MoEConfig& c, bool shared = false) {
  auto se = shared ? std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size, false, DType::f64) : nullptr;
  auto m = std::make_shared<nn::MoE>(c, DType::f64, true, se, shared);
  m->set_parameter("gate.weight",
                   uniform({c.num_experts, c.hidden_size}, -1, 1, TensorOptions(DType::f64)).set_requires_grad(true));
  return m;
}

/// Top-k experts of a row of scores (descending, ties: lower index first).
std::vector<int64_t> top_k(const std::vector<double>& row, int64_t k) {
  std::vector<int64_t> idx(row.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  idx.resize(k);
  return idx;
}

/// The dense reference: per token, sum over its top-k experts of weight * expert MLP.
Tensor reference(nn::MoE& m, const Tensor& x) {
  const nn::MoEConfig& c = m.config();
  const int64_t N = x.size(0), E = c.num_experts, I = c.moe_intermediate_size;
  const Tensor wr = m.get_parameter("gate.weight"), w1 = m.get_parameter("experts.gate_up_proj"),
               w2 = m.get_parameter("experts.down_proj");
  const Tensor logits = mm(x, wr.t());
  const Tensor scores = c.score_func == "softmax" ? softmax(logits, -1) : sigmoid(logits);
  const std::vector<double> s = scores.detach().to_vector<double>();
  std::vector<Tensor> rows;
  for (int64_t t = 0; t < N; ++t) {
    const std::vector<double> row(s.begin() + t * E, s.begin() + (t + 1) * E);
    const Tensor xt = x.narrow(0, t, 1);
    std::vector<Tensor> w;
    for (int64_t e : top_k(row, c.num_experts_per_tok)) w.push_back(scores.narrow(0, t, 1).narrow(1, e, 1));
    Tensor wsum = w[0];
    for (size_t j = 1; j < w.size(); ++j) wsum = add(wsum, w[j]);
    Tensor y = zeros({1, c.hidden_size}, TensorOptions(DType::f64));
    int64_t j = 0;
    for (int64_t e : top_k(row, c.num_experts_per_tok)) {
      const Tensor g = w1.narrow(0, e, 1).squeeze(0).narrow(0, 0, I), u = w1.narrow(0, e, 1).squeeze(0).narrow(0, I, I);
      const Tensor h = mul(silu(mm(xt, g.t())), mm(xt, u.t()));
      const Tensor out = mm(h, w2.narrow(0, e, 1).squeeze(0).t());
      const Tensor wj = c.norm_topk_prob ? div(w[j], wsum) : w[j];
      y = add(y, mul(out, wj));
      ++j;
    }
    rows.push_back(y);
  }
  Tensor out = cat(rows, 0);
  if (m.has_module("shared_expert")) {
    Tensor se = mm(x, m.get_parameter("shared_expert.weight").t());
    out = add(out, mul(sigmoid(mm(x, m.get_parameter("shared_expert_gate.weight").t())), se));
  }
  return out;
}

/// Runs m with the parameters replaced by v (router, gate_up, down) on input v[0].
Tensor run_with(nn::MoE& m, const std::vector<Tensor>& v) {
  m.set_parameter("gate.weight", v[1]);
  m.set_parameter("experts.gate_up_proj", v[2]);
  m.set_parameter("experts.down_proj", v[3]);
  return m.call(v[0]);
}

std::vector<Tensor> leaves(nn::MoE& m, const Tensor& x) {
  return {x.detach().clone().set_requires_grad(true), m.get_parameter("gate.weight").detach().clone().set_requires_grad(true),
          m.get_parameter("experts.gate_up_proj").detach().clone().set_requires_grad(true),
          m.get_parameter("experts.down_proj").detach().clone().set_requires_grad(true)};
}
}  // namespace

TEST_CASE("MoE forward equals the dense per-token reference", "[moe]") {
  manual_seed(21);
  struct Case {
    nn::MoEConfig c;
    bool shared;
  };
  for (const Case& cs : {Case{config(4, 2, true), false}, Case{config(4, 2, false), false},
                         Case{config(5, 3, true, "sigmoid"), false}, Case{config(5, 1, false, "sigmoid"), false},
                         Case{config(4, 4, true), false}, Case{config(3, 2, true), true}}) {
    auto m = make_moe(cs.c, cs.shared);
    Tensor x = uniform({2, 7, 6}, -1, 1, TensorOptions(DType::f64));
    Tensor y = m->call(x);
    CHECK(y.sizes() == x.sizes());
    CHECK(max_abs_diff(reshape(y, {14, 6}), reference(*m, reshape(x, {14, 6}))) < kF64Tol);
  }
}

TEST_CASE("MoE skewed routing: one expert takes every token, the others none", "[moe]") {
  manual_seed(22);
  auto c = config(4, 1, true);
  auto m = make_moe(c);
  // Router rows 1..3 zero, row 0 along x's mean direction: expert 0 wins for x > 0.
  Tensor wr = zeros({4, 6}, TensorOptions(DType::f64));
  wr.narrow(0, 0, 1).fill_(1.0);
  m->set_parameter("gate.weight", wr);
  Tensor x = uniform({9, 6}, 0.1, 1, TensorOptions(DType::f64));
  Tensor y = m->call(x);
  CHECK(m->last_router_stats().tokens_per_expert == Shape{9, 0, 0, 0});
  CHECK(max_abs_diff(y, reference(*m, x)) < kF64Tol);
  auto f = [&](const std::vector<Tensor>& v) { return run_with(*m, v); };
  CHECK(gradcheck(f, leaves(*m, x)) == "");
}

TEST_CASE("MoE routing ties: the lower expert index wins", "[moe]") {
  manual_seed(26);
  auto c = config(5, 3, true);
  auto m = make_moe(c);
  Tensor x = uniform({8, 6}, 0.1, 1, TensorOptions(DType::f64));
  // All logits equal: experts 0, 1, 2 for every token.
  m->set_parameter("gate.weight", zeros({5, 6}, TensorOptions(DType::f64)));
  Tensor y = m->call(x);
  CHECK(m->last_router_stats().tokens_per_expert == Shape{8, 8, 8, 0, 0});
  CHECK(max_abs_diff(y, reference(*m, x)) < kF64Tol);
  // Experts 1 and 3 tie at the top (equal router rows), 0, 2, 4 tie below them: 1, 3, then 0.
  Tensor wr = zeros({5, 6}, TensorOptions(DType::f64));
  wr.narrow(0, 1, 1).fill_(0.5);
  wr.narrow(0, 3, 1).fill_(0.5);
  m->set_parameter("gate.weight", wr);
  y = m->call(x);
  CHECK(m->last_router_stats().tokens_per_expert == Shape{8, 8, 0, 8, 0});
  CHECK(max_abs_diff(y, reference(*m, x)) < kF64Tol);
}

TEST_CASE("MoE gradients match finite differences", "[moe][grad]") {
  manual_seed(23);
  for (const auto& c : {config(4, 2, true), config(5, 2, false, "sigmoid")}) {
    auto m = make_moe(c);
    Tensor x = uniform({6, 6}, -1, 1, TensorOptions(DType::f64));
    auto f = [&](const std::vector<Tensor>& v) { return run_with(*m, v); };
    CHECK(gradcheck(f, leaves(*m, x)) == "");
  }
}

TEST_CASE("MoE with a gated shared expert: gradients match finite differences", "[moe][grad]") {
  manual_seed(24);
  auto c = config(3, 2, true);
  auto m = make_moe(c, /*shared=*/true);
  Tensor x = uniform({5, 6}, -1, 1, TensorOptions(DType::f64));
  Tensor ws = m->get_parameter("shared_expert.weight").detach().clone().set_requires_grad(true);
  Tensor wg = m->get_parameter("shared_expert_gate.weight").detach().clone().set_requires_grad(true);
  auto f = [&](const std::vector<Tensor>& v) {
    m->set_parameter("shared_expert.weight", v[1]);
    m->set_parameter("shared_expert_gate.weight", v[2]);
    return m->call(v[0]);
  };
  CHECK(gradcheck(f, {x.clone().set_requires_grad(true), ws, wg}) == "");
}

TEST_CASE("load-balancing loss and z-loss equal their formulas", "[moe][aux]") {
  manual_seed(25);
  auto c = config(4, 2, true);
  auto m = make_moe(c);
  Tensor x = uniform({10, 6}, -1, 1, TensorOptions(DType::f64));
  m->call(x);
  const nn::RouterStats& st = m->last_router_stats();
  // by hand: scores, top-2 counts, E * sum_e f_e * P_e; mean of logsumexp^2
  const Tensor logits = mm(x, m->get_parameter("gate.weight").t());
  const std::vector<double> p = softmax(logits, -1).to_vector<double>(), l = logits.to_vector<double>();
  std::vector<double> cnt(4, 0), ps(4, 0);
  double z = 0;
  for (int64_t t = 0; t < 10; ++t) {
    std::vector<double> row(p.begin() + t * 4, p.begin() + t * 4 + 4);
    for (int64_t e : top_k(row, 2)) cnt[e] += 1;
    double se = 0;
    for (int64_t e = 0; e < 4; ++e) {
      ps[e] += row[e];
      se += std::exp(l[t * 4 + e]);
    }
    z += std::log(se) * std::log(se);
  }
  double aux = 0;
  for (int64_t e = 0; e < 4; ++e) aux += (cnt[e] / 10.0) * (ps[e] / 10.0);
  aux *= 4;
  CHECK(st.tokens_per_expert == Shape{int64_t(cnt[0]), int64_t(cnt[1]), int64_t(cnt[2]), int64_t(cnt[3])});
  CHECK(nn::load_balancing_loss({st}).item<double>() == Approx(aux).epsilon(1e-13));
  CHECK(nn::router_z_loss({st}).item<double>() == Approx(z / 10.0).epsilon(1e-13));
  CHECK(nn::moe_auxiliary_loss(*m, 0.01, 0.001).item<double>() == Approx(0.01 * aux + 0.001 * z / 10).epsilon(1e-13));
  CHECK_FALSE(nn::moe_auxiliary_loss(*m, 0.0, 0.0).defined());
  // two layers: HF concatenates their tokens (counts and probability sums added, N added)
  const double two = nn::load_balancing_loss({st, st}).item<double>();
  CHECK(two == Approx(aux).epsilon(1e-13));  // the same layer twice: same fractions
  // gradients of both losses w.r.t. the router weight and the input
  auto f = [&](const std::vector<Tensor>& v) {
    m->set_parameter("gate.weight", v[1]);
    m->call(v[0]);
    return add(nn::load_balancing_loss({m->last_router_stats()}), nn::router_z_loss({m->last_router_stats()}));
  };
  CHECK(gradcheck(f, {x.clone().set_requires_grad(true),
                      m->get_parameter("gate.weight").detach().clone().set_requires_grad(true)}) == "");
}

TEST_CASE("MoE in bf16 runs and stays within bf16 rounding of f64", "[moe]") {
  manual_seed(26);
  auto c = config(4, 2, true);
  auto m = make_moe(c);
  Tensor x = uniform({8, 6}, -1, 1, TensorOptions(DType::f64));
  const Tensor ref = m->call(x);
  auto mb = std::make_shared<nn::MoE>(c, DType::bf16, false);
  mb->load_state_dict(m->state_dict());
  Tensor y = mb->call(to_dtype(x, DType::bf16));
  CHECK(y.dtype() == DType::bf16);
  // values ~0.3, several bf16 roundings (inputs, weights, intermediate): a few 2^-8 relative
  CHECK(max_abs_diff(to_dtype(y, DType::f64), ref) < 0.03);
}

TEST_CASE("MoE errors name the key", "[moe]") {
  CHECK_THROWS_WITH(nn::MoE(config(4, 5)), Catch::Contains("num_experts_per_tok=5"));
  CHECK_THROWS_WITH(nn::MoE(config(4, 2, true, "relu")), Catch::Contains("score_func='relu'"));
  auto c = config();
  c.hidden_act = "gelu";
  CHECK_THROWS_WITH(nn::MoE(c), Catch::Contains("only silu"));
  auto m = make_moe(config());
  CHECK_THROWS_WITH(m->call(zeros({3, 5}, TensorOptions(DType::f64))), Catch::Contains("expected [..., 6]"));
  CHECK_THROWS_WITH(nn::load_balancing_loss({}), Catch::Contains("no router statistics"));
  // GroupedExperts' row weights: [M], and not with a token dispatcher.
  auto ex = m->experts();
  const Tensor xs = zeros({4, 6}, TensorOptions(DType::f64)), counts = from_vector<int64_t>({1, 1, 1, 1}, {4});
  CHECK_THROWS_WITH(ex->call_list({xs, counts, zeros({3}, TensorOptions(DType::f64))}),
                    Catch::Contains("row_weights [3] (expected [4])"));
  struct Identity : nn::TokenDispatcher {
    std::pair<Tensor, Shape> dispatch(const Tensor& x, const Shape& c) override { return {x, c}; }
    Tensor combine(const Tensor& y) override { return y; }
    Tensor local_experts(const Tensor& w) override { return w; }
  };
  ex->set_dispatcher(std::make_shared<Identity>());
  CHECK(ex->call_list({xs, counts}).at(0).sizes() == Shape{4, 6});
  CHECK_THROWS_WITH(ex->call_list({xs, counts, zeros({4}, TensorOptions(DType::f64))}),
                    Catch::Contains("row_weights with a token dispatcher"));
}

TEST_CASE("MoE under activation checkpointing keeps the forward's routing", "[moe][ac]") {
  manual_seed(27);
  auto m = make_moe(config(4, 2, true));
  Tensor x = uniform({6, 6}, -1, 1, TensorOptions(DType::f64));
  Tensor wt = uniform({6, 6}, -1, 1, TensorOptions(DType::f64));
  // reference gradients without checkpointing
  Tensor x1 = x.clone().set_requires_grad(true);
  sum(mul(m->call(x1), wt)).backward();
  std::map<std::string, Tensor> ref;
  for (auto& [n, p] : m->named_parameters()) {
    ref[n] = p.grad().clone();
    p.set_grad(Tensor());
  }
  const int64_t before = m->routings();
  Tensor x2 = x.clone().set_requires_grad(true);
  Tensor y = checkpoint([&](const std::vector<Tensor>& v) { return m->call(v[0]); }, {x2});
  // a checkpointed forward ran without a graph: an auxiliary loss could not train the router
  CHECK_THROWS_WITH(nn::moe_auxiliary_loss(*m, 0.01, 0.0), Catch::Contains("no autograd graph"));
  sum(mul(y, wt)).backward();
  CHECK(m->routings() == before + 1);  // the recomputation reused the forward's routing (was + 2)
  CHECK(max_abs_diff(x2.grad(), x1.grad()) < kF64Tol);
  for (auto& [n, p] : m->named_parameters()) CHECK(max_abs_diff(p.grad(), ref[n]) < kF64Tol);
}
