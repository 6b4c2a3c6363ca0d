// scaled_dot_product_attention with an SdpaMask (document ids, query / key offsets) and RoPE
// tables from per-token position ids: a packed row equals running each document alone (values and
// gradients, f64, GQA, sliding window, documents crossing the kernels' 64 x 128 blocks); unsorted
// document ids against a naive masked reference; a query chunk with offsets equals the same rows
// of the full attention (context-parallel chunks); finite differences; bad input.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {

// f64 throughout: the blocked kernel and the reference sum in different orders (~1e-15 relative).
constexpr double kTolOut = 1e-12;
constexpr double kTolGrad = 1e-11;

Tensor leaf(const Shape& s) { return randn(s, TensorOptions(DType::f64)).set_requires_grad(true); }

/// i64 [B, T] document ids of rows made of documents of the given lengths (ids 0, 1, ... per row).
Tensor document_ids(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> ids;
  int64_t T = 0;
  for (const auto& lens : rows) {
    int64_t n = 0;
    for (size_t d = 0; d < lens.size(); ++d)
      for (int64_t t = 0; t < lens[d]; ++t, ++n) ids.push_back(static_cast<int64_t>(d));
    T = n;
  }
  return from_vector<int64_t>(ids, {static_cast<int64_t>(rows.size()), T});
}

/// Naive attention with an explicit visibility mask m [B, T, S] (1 = masked), GQA by repeating kv heads.
Tensor naive_masked(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<uint8_t>& m) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t g = Hq / Hkv;
  auto rep = [&](const Tensor& t) {
    return t.unsqueeze(2).expand({B, Hkv, g, S, t.size(3)}).reshape({B, Hq, S, t.size(3)});
  };
  Tensor s = mul(matmul(q, rep(k).transpose(-1, -2)), 1.0 / std::sqrt(static_cast<double>(D)));
  s = masked_fill(s, from_vector<uint8_t>(m, {B, 1, T, S}), -std::numeric_limits<double>::infinity());
  return matmul(softmax(s, -1), rep(v));
}

/// Runs attention over the packed rows `lens` (documents of each row) once with document ids and
/// once document by document (slices of the same leaves, alone); compares outputs and the
/// gradients of sum(out * w).
void compare_packed_with_alone(const std::vector<std::vector<int64_t>>& lens, int64_t Hq, int64_t Hkv, int64_t D,
                               int64_t window) {
  Tensor docs = document_ids(lens);
  const int64_t B = docs.size(0), T = docs.size(1);
  INFO("B=" << B << " T=" << T << " Hq=" << Hq << " Hkv=" << Hkv << " window=" << window);
  Tensor q = leaf({B, Hq, T, D}), k = leaf({B, Hkv, T, D}), v = leaf({B, Hkv, T, D});
  Tensor w = randn({B, Hq, T, D}, DType::f64);
  SdpaMask mask;
  mask.q_document_ids = docs;
  Tensor out = scaled_dot_product_attention(q, k, v, true, std::nullopt, window, mask);
  sum(mul(out, w)).backward();
  const Tensor dq = q.grad(), dk = k.grad(), dv = v.grad();
  for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());

  std::vector<Tensor> rows;
  Tensor ref_loss = zeros({}, DType::f64);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<Tensor> pieces;
    int64_t s0 = 0;
    for (int64_t n : lens[b]) {
      auto part = [&](const Tensor& t) { return t.narrow(0, b, 1).narrow(2, s0, n); };
      Tensor o = scaled_dot_product_attention(part(q), part(k), part(v), true, std::nullopt, window);
      ref_loss = add(ref_loss, sum(mul(o, part(w))));
      pieces.push_back(o);
      s0 += n;
    }
    rows.push_back(cat(pieces, 2));
  }
  ref_loss.backward();
  CHECK(max_abs_diff(out, cat(rows, 0)) < kTolOut);
  CHECK(max_abs_diff(dq, q.grad()) < kTolGrad);
  CHECK(max_abs_diff(dk, k.grad()) < kTolGrad);
  CHECK(max_abs_diff(dv, v.grad()) < kTolGrad);
}

}  // namespace

TEST_CASE("sdpa with document ids equals each document alone", "[attention][packing]") {
  manual_seed(31);
  // Documents that start and end inside the CPU kernel's 64-query / 128-key blocks, one spanning
  // several blocks, single-token documents, and a trailing padding document.
  const std::vector<std::vector<int64_t>> lens = {{5, 70, 1, 60, 3, 61}, {130, 1, 69}};
  for (int64_t window : {0, 7}) {
    compare_packed_with_alone(lens, 4, 2, 8, window);  // GQA
    compare_packed_with_alone(lens, 2, 2, 8, window);
  }
  compare_packed_with_alone({{3, 4}}, 3, 1, 4, 0);  // one block, multi-query
}

TEST_CASE("sdpa with unsorted document ids matches the masked reference", "[attention][packing]") {
  manual_seed(37);
  const int64_t B = 2, T = 140, S = 150;  // keys past the queries: bottom-right causal, S - T = 10
  std::vector<int64_t> qd(B * T), kd(B * S);
  for (int64_t i = 0; i < B * T; ++i) qd[i] = (i * 7 / 3) % 5;
  for (int64_t j = 0; j < B * S; ++j) kd[j] = j % S < 5 ? j % S : (j * 11 / 5) % 5;  // keys 0..4: every id, so
                                                                                   // every query sees a key
  std::vector<uint8_t> m(B * T * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < S; ++j) m[(b * T + i) * S + j] = j > i + S - T || qd[b * T + i] != kd[b * S + j];
  SdpaMask mask;
  mask.q_document_ids = from_vector<int64_t>(qd, {B, T});
  mask.k_document_ids = from_vector<int64_t>(kd, {B, S});
  Tensor q = leaf({B, 4, T, 8}), k = leaf({B, 2, S, 8}), v = leaf({B, 2, S, 8});
  Tensor w = randn({B, 4, T, 8}, DType::f64);
  Tensor out = scaled_dot_product_attention(q, k, v, true, std::nullopt, 0, mask);
  sum(mul(out, w)).backward();
  const Tensor dq = q.grad(), dk = k.grad(), dv = v.grad();
  for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
  Tensor ref = naive_masked(q, k, v, m);
  sum(mul(ref, w)).backward();
  CHECK(max_abs_diff(out, ref) < kTolOut);
  CHECK(max_abs_diff(dq, q.grad()) < kTolGrad);
  CHECK(max_abs_diff(dk, k.grad()) < kTolGrad);
  CHECK(max_abs_diff(dv, v.grad()) < kTolGrad);
}

TEST_CASE("sdpa with query / key offsets equals the rows of the full attention", "[attention][packing]") {
  // A context-parallel rank holds query chunk [t0, t0 + n) and attends to keys [k0, k0 + m) of the
  // global sequence: with q_offset = t0, k_offset = k0 its output is the full attention's rows
  // restricted to those keys; chunks whose keys cover [0, t0 + n) give exactly the full rows.
  manual_seed(41);
  const int64_t T = 150;
  Tensor docs = document_ids({{40, 90, 20}});
  Tensor q = leaf({1, 4, T, 8}), k = leaf({1, 2, T, 8}), v = leaf({1, 2, T, 8});
  for (bool with_docs : {false, true}) {
    SdpaMask full;
    if (with_docs) full.q_document_ids = docs;
    for (int64_t window : {0, 9}) {
      Tensor ref = scaled_dot_product_attention(q, k, v, true, std::nullopt, window, full);
      for (auto [t0, n] : {std::pair<int64_t, int64_t>{0, 75}, {75, 75}, {37, 80}}) {
        INFO("docs=" << with_docs << " window=" << window << " t0=" << t0 << " n=" << n);
        SdpaMask chunk;
        chunk.q_offset = t0;
        chunk.k_offset = 0;
        if (with_docs) {
          chunk.q_document_ids = docs.narrow(1, t0, n).contiguous();
          chunk.k_document_ids = docs;
        }
        Tensor out = scaled_dot_product_attention(q.narrow(2, t0, n), k, v, true, std::nullopt, window, chunk);
        CHECK(max_abs_diff(out, ref.narrow(2, t0, n)) < kTolOut);
      }
    }
  }
  // Keys offset too: the query chunk [100, 150) against key chunk [60, 150) sees what the full
  // attention sees whenever its window starts after key 60.
  SdpaMask part;
  part.q_offset = 100;
  part.k_offset = 60;
  Tensor ref = scaled_dot_product_attention(q, k, v, true, std::nullopt, 30);
  Tensor out = scaled_dot_product_attention(q.narrow(2, 100, 50), k.narrow(2, 60, 90), v.narrow(2, 60, 90), true,
                                            std::nullopt, 30, part);
  CHECK(max_abs_diff(out, ref.narrow(2, 100, 50)) < kTolOut);
}

/// One f32 case of the kernels against the f64 masked reference: q / k / v (and the output
/// gradient) as the projections' [B, T, H, D] views, query i visible to key j when
/// j <= i + diag, j > i + diag - window (window > 0) and qd[b, i] == kd[b, j] (ids given). Rows
/// without a visible key are 0 with no gradient (the reference keeps them unmasked, then zeroes
/// them).
void compare_f32_with_masked(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t S, int64_t D, int64_t Dv,
                             int64_t window, const SdpaMask& mask, const std::vector<int64_t>& qd,
                             const std::vector<int64_t>& kd) {
  const int64_t diag = mask.q_offset.value_or(mask.k_offset + S - T) - mask.k_offset;
  INFO("B=" << B << " T=" << T << " S=" << S << " D=" << D << " Dv=" << Dv << " window=" << window
            << " diag=" << diag << " docs=" << !qd.empty());
  auto view32 = [](int64_t b, int64_t h, int64_t l, int64_t d) {
    return randn({b, l, h, d}).transpose(1, 2).detach().set_requires_grad(true);
  };
  Tensor q = view32(B, Hq, T, D), k = view32(B, Hkv, S, D), v = view32(B, Hkv, S, Dv);
  Tensor w = randn({B, T, Hq, Dv}).transpose(1, 2);
  Tensor out = scaled_dot_product_attention(q, k, v, true, std::nullopt, window, mask);
  sum(mul(out, w)).backward();
  std::vector<uint8_t> m(static_cast<size_t>(B * T * S));
  std::vector<double> live(static_cast<size_t>(B * T), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      for (int64_t j = 0; j < S; ++j) {
        const bool hidden = j > i + diag || (window > 0 && j <= i + diag - window) ||
                            (!qd.empty() && qd[b * T + i] != kd[b * S + j]);
        m[(b * T + i) * S + j] = hidden;
        if (!hidden) live[b * T + i] = 1.0;
      }
      if (live[b * T + i] == 0.0)
        for (int64_t j = 0; j < S; ++j) m[(b * T + i) * S + j] = 0;  // zeroed below instead
    }
  Tensor q64 = q.detach().to(DType::f64).set_requires_grad(true), k64 = k.detach().to(DType::f64).set_requires_grad(true);
  Tensor v64 = v.detach().to(DType::f64).set_requires_grad(true);
  Tensor ref = mul(naive_masked(q64, k64, v64, m), from_vector<double>(live, {B, 1, T, 1}));
  sum(mul(ref, w.to(DType::f64))).backward();
  CHECK(max_abs_diff(out.to(DType::f64), ref) < 2e-5);
  CHECK(max_abs_diff(q.grad().to(DType::f64), q64.grad()) < 1e-4);
  CHECK(max_abs_diff(k.grad().to(DType::f64), k64.grad()) < 1e-4);
  CHECK(max_abs_diff(v.grad().to(DType::f64), v64.grad()) < 1e-4);
}

TEST_CASE("sdpa f32 kernels with document ids, offsets and Dv != D match the f64 masked reference",
          "[attention][packing]") {
  // The f32 path's own tiles (masks in the epilogues, zero_other_documents, the causal bounds of
  // each row / key tile) under every mask kind: packed documents crossing the 64 x 128 blocks with
  // GQA and windows 0 / 7 / 150; unsorted ids with T != S; a negative diagonal (the first rows see
  // no key) with a window; Dv != D.
  manual_seed(47);
  Tensor docs = document_ids({{5, 70, 1, 60, 3, 61}, {130, 1, 69}});
  const std::vector<int64_t> ids = docs.to_vector<int64_t>();
  SdpaMask packed;
  packed.q_document_ids = docs;
  for (int64_t window : {0, 7, 150}) compare_f32_with_masked(2, 4, 2, 200, 200, 16, 16, window, packed, ids, ids);
  const int64_t B = 2, T = 140, S = 150;
  std::vector<int64_t> qd(B * T), kd(B * S);
  for (int64_t i = 0; i < B * T; ++i) qd[i] = (i * 7 / 3) % 5;
  for (int64_t j = 0; j < B * S; ++j) kd[j] = j % S < 5 ? j % S : (j * 11 / 5) % 5;
  SdpaMask unsorted;
  unsorted.q_document_ids = from_vector<int64_t>(qd, {B, T});
  unsorted.k_document_ids = from_vector<int64_t>(kd, {B, S});
  compare_f32_with_masked(B, 6, 2, T, S, 16, 16, 0, unsorted, qd, kd);
  compare_f32_with_masked(B, 6, 2, T, S, 16, 16, 40, unsorted, qd, kd);
  SdpaMask behind;  // keys start 20 after the queries: query i sees key j <= i - 20
  behind.q_offset = 0;
  behind.k_offset = 20;
  compare_f32_with_masked(1, 4, 1, 150, 170, 16, 16, 0, behind, {}, {});
  compare_f32_with_masked(1, 4, 1, 150, 170, 16, 16, 30, behind, {}, {});
  compare_f32_with_masked(1, 4, 2, 200, 200, 16, 24, 0, SdpaMask{}, {}, {});  // Dv != D
  SdpaMask first_row;  // Dv != D with documents
  first_row.q_document_ids = docs.narrow(0, 0, 1).contiguous();
  const std::vector<int64_t> ids0(ids.begin(), ids.begin() + 200);
  compare_f32_with_masked(1, 4, 2, 200, 200, 16, 24, 7, first_row, ids0, ids0);
}

TEST_CASE("sdpa with document ids and offsets: backward matches finite differences", "[attention][packing][grad]") {
  manual_seed(43);
  Tensor docs = document_ids({{2, 3, 2}, {4, 3}});
  SdpaMask mask;
  mask.q_document_ids = docs;
  CHECK(gradcheck([&](const std::vector<Tensor>& x) {
          return scaled_dot_product_attention(x[0], x[1], x[2], true, std::nullopt, 0, mask);
        },
        {leaf({2, 4, 7, 4}), leaf({2, 2, 7, 4}), leaf({2, 2, 7, 4})}) == "");
  SdpaMask chunk;
  chunk.q_offset = 3;
  chunk.q_document_ids = docs.narrow(1, 3, 4).contiguous();
  chunk.k_document_ids = docs;
  CHECK(gradcheck([&](const std::vector<Tensor>& x) {
          return scaled_dot_product_attention(x[0], x[1], x[2], true, std::nullopt, 2, chunk);
        },
        {leaf({2, 2, 4, 4}), leaf({2, 1, 7, 4}), leaf({2, 1, 7, 4})}) == "");
}

TEST_CASE("sdpa mask errors", "[attention][packing]") {
  Tensor x = zeros({1, 2, 4, 8}, DType::f64);
  SdpaMask m;
  m.q_document_ids = zeros({1, 4}, DType::i32);
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, x, x, true, std::nullopt, 0, m),
                    Catch::Contains("q_document_ids must be int64 [B, T]"));
  m.q_document_ids = zeros({1, 5}, DType::i64);
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, x, x, true, std::nullopt, 0, m), Catch::Contains("[1, 4]"));
  m.q_document_ids = zeros({1, 4}, DType::i64);
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, zeros({1, 2, 6, 8}, DType::f64), zeros({1, 2, 6, 8}, DType::f64),
                                                 true, std::nullopt, 0, m),
                    Catch::Contains("k_document_ids must be int64 [B, S] = [1, 6]"));
  SdpaMask k_only;
  k_only.k_document_ids = zeros({1, 4}, DType::i64);
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, x, x, true, std::nullopt, 0, k_only),
                    Catch::Contains("without q_document_ids"));
  SdpaMask off;
  off.q_offset = 2;
  CHECK_THROWS_WITH(scaled_dot_product_attention(x, x, x, false, std::nullopt, 0, off),
                    Catch::Contains("offsets need is_causal"));
}

TEST_CASE("rope_tables from position ids picks each token's position", "[rope][packing]") {
  Tensor pos = from_vector<int64_t>({0, 1, 2, 0, 1, 5, 3, 0}, {2, 4});
  for (DType dt : {DType::f32, DType::f64}) {
    auto [c, s] = rope_tables(pos, 6, 500.0, dt);
    REQUIRE(c.sizes() == Shape{2, 1, 4, 6});
    auto [tc, ts] = rope_tables(6, 6, 500.0, 0, dt);  // positions 0..5
    const auto p = pos.to_vector<int64_t>();
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < 4; ++t) {
        auto row = [&](const Tensor& x) { return to_dtype(x.narrow(0, b, 1).narrow(2, t, 1).reshape({-1}), DType::f64); };
        auto tab = [&](const Tensor& x) { return to_dtype(x.narrow(0, p[b * 4 + t], 1).reshape({-1}), DType::f64); };
        CHECK(row(c).to_vector<double>() == tab(tc).to_vector<double>());
        CHECK(row(s).to_vector<double>() == tab(ts).to_vector<double>());
      }
  }
  CHECK_THROWS_WITH(rope_tables(zeros({4}, DType::i64), 6, 500.0), Catch::Contains("int64 [B, T]"));
  CHECK_THROWS_WITH(rope_tables(from_vector<int64_t>({0, -1}, {1, 2}), 6, 500.0), Catch::Contains(">= 0"));
}
