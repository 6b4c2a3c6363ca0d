// scaled_dot_product_attention (flash-style kernels) against a naive reference that
// materialises the T x S scores: T != S, GQA, causal (bottom-right aligned) and not, sizes
// that are not multiples of the 64 x 64 blocks, non-contiguous inputs; backward against the
// reference's autograd and against finite differences; the projections' [B, T, H, D] layout
// read and written in place (rope + sdpa without layout copies) against contiguous inputs; bad
// shapes.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <omp.h>

#include "gradcheck.h"
#include "tensor/dispatch.h"
#include "tensor/profiler.h"
#include "tensor/random.h"

using namespace dtr;
using dtr::testing::gradcheck;
using dtr::testing::max_abs_diff;

namespace {

/// Naive attention: repeat kv heads, full scores, mask (key j visible from query i when
/// j <= i + S - T, and j > i + S - T - window with a sliding window), softmax, weighted sum.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, int64_t window = 0) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t g = Hq / Hkv;
  auto rep = [&](const Tensor& t) {
    return t.unsqueeze(2).expand({B, Hkv, g, S, t.size(3)}).reshape({B, Hq, S, t.size(3)});
  };
  Tensor s = mul(matmul(q, rep(k).transpose(-1, -2)), 1.0 / std::sqrt(static_cast<double>(D)));
  if (causal) {
    std::vector<uint8_t> m(static_cast<size_t>(T * S));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < S; ++j) m[i * S + j] = j > i + S - T || (window > 0 && j <= i + S - T - window);
    s = masked_fill(s, from_vector<uint8_t>(m, {T, S}), -std::numeric_limits<double>::infinity());
  }
  return matmul(softmax(s, -1), rep(v));
}

Tensor leaf(const Shape& s) { return randn(s, TensorOptions(DType::f64)).set_requires_grad(true); }

/// Compares forward and gradients (of sum(out * w)) of the kernel with the naive reference.
void compare_with_naive(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t S, int64_t D, bool causal,
                        int64_t window = 0) {
  INFO("B=" << B << " Hq=" << Hq << " Hkv=" << Hkv << " T=" << T << " S=" << S << " D=" << D << " causal=" << causal
            << " window=" << window);
  Tensor q = leaf({B, Hq, T, D}), k = leaf({B, Hkv, S, D}), v = leaf({B, Hkv, S, D});
  Tensor w = randn({B, Hq, T, D}, DType::f64);
  Tensor out = scaled_dot_product_attention(q, k, v, causal, std::nullopt, window);
  sum(mul(out, w)).backward();
  Tensor dq = q.grad(), dk = k.grad(), dv = v.grad();
  q.set_grad(Tensor());
  k.set_grad(Tensor());
  v.set_grad(Tensor());
  Tensor ref = naive_attention(q, k, v, causal, window);
  sum(mul(ref, w)).backward();
  CHECK(max_abs_diff(out, ref) < 1e-12);
  CHECK(max_abs_diff(dq, q.grad()) < 1e-11);
  CHECK(max_abs_diff(dk, k.grad()) < 1e-11);
  CHECK(max_abs_diff(dv, v.grad()) < 1e-11);
}

}  // namespace

TEST_CASE("sdpa hand-checked", "[attention]") {
  // one query, two keys: weights softmax(q.k / sqrt(D))
  Tensor q = from_vector<double>({1, 0}, {1, 1, 1, 2});
  Tensor k = from_vector<double>({1, 0, 0, 1}, {1, 1, 2, 2});
  Tensor v = from_vector<double>({10, 0, 0, 20}, {1, 1, 2, 2});
  const double a = std::exp(1 / std::sqrt(2.0)), p0 = a / (a + 1);
  auto y = scaled_dot_product_attention(q, k, v, false).to_vector<double>();
  CHECK(y[0] == Approx(10 * p0));
  CHECK(y[1] == Approx(20 * (1 - p0)));
  // causal with S > T bottom-right: the single query is the last position and sees both keys
  CHECK(scaled_dot_product_attention(q, k, v, true).to_vector<double>() == y);
  // explicit scale
  auto z = scaled_dot_product_attention(q, k, v, false, 0.0).to_vector<double>();
  CHECK(z == std::vector<double>{5, 10});
}

TEST_CASE("sdpa matches the naive reference", "[attention]") {
  manual_seed(13);
  for (bool causal : {true, false}) {
    compare_with_naive(1, 2, 2, 4, 4, 8, causal);
    compare_with_naive(2, 4, 2, 3, 5, 4, causal);      // GQA, S > T
    compare_with_naive(1, 6, 2, 70, 130, 16, causal);  // several blocks, partial blocks
    compare_with_naive(1, 2, 1, 129, 129, 8, causal);  // T = S just over two blocks
    compare_with_naive(1, 1, 1, 1, 65, 3, causal);     // decode step
  }
}

TEST_CASE("sdpa f32 kernels (attention tiles per block) match the f64 naive reference", "[attention]") {
  // The f32 path runs its block products through its own AVX-512 tiles (nn_attention_block_gemm.h;
  // cpu::gemm without AVX-512, f64 through Eigen): q / k / v as
  // [B, T, H, D] views transposed to [B, H, T, D] (the model's layout: row stride H * D), GQA,
  // partial query and key blocks, causal / full / sliding window.
  manual_seed(31);
  struct Case { int64_t B, Hq, Hkv, T, S, D; bool causal; int64_t window; };
  // Also the blocks' causal bounds (row tiles whose keys end inside a block, key tiles seen by
  // only some rows): D = 64 over several key blocks (forward 256, backward 128 keys), T > S
  // (queries without keys), a window with T != S; 32 kv heads x batch rows, whose k^T / v^T
  // (1.2 MB) the backward keeps in a tensor instead of the per-thread scratch.
  for (const Case& c : {Case{2, 6, 2, 70, 70, 16, true, 0}, Case{1, 4, 4, 130, 130, 8, false, 0},
                        Case{1, 3, 1, 100, 150, 12, true, 0}, Case{1, 2, 1, 90, 90, 8, true, 40},
                        Case{1, 4, 2, 300, 300, 64, true, 0}, Case{1, 2, 1, 150, 100, 64, true, 0},
                        Case{1, 2, 2, 200, 260, 16, true, 50}, Case{4, 8, 8, 128, 128, 32, true, 0}}) {
    INFO("T=" << c.T << " S=" << c.S << " causal=" << c.causal << " window=" << c.window);
    auto view32 = [](int64_t B, int64_t H, int64_t L, int64_t D) { return randn({B, L, H, D}).transpose(1, 2); };
    Tensor q = view32(c.B, c.Hq, c.T, c.D).detach(), k = view32(c.B, c.Hkv, c.S, c.D).detach();
    Tensor v = view32(c.B, c.Hkv, c.S, c.D).detach();
    REQUIRE(!q.is_contiguous());
    q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true);
    Tensor w = randn({c.B, c.Hq, c.T, c.D});
    Tensor out = scaled_dot_product_attention(q, k, v, c.causal, std::nullopt, c.window);
    sum(mul(out, w)).backward();
    Tensor q64 = q.detach().to(DType::f64).set_requires_grad(true), k64 = k.detach().to(DType::f64).set_requires_grad(true);
    Tensor v64 = v.detach().to(DType::f64).set_requires_grad(true);
    Tensor ref = naive_attention(q64, k64, v64, c.causal, c.window);
    sum(mul(ref, w.to(DType::f64))).backward();
    CHECK(max_abs_diff(out.to(DType::f64), ref) < 2e-5);
    CHECK(max_abs_diff(q.grad().to(DType::f64), q64.grad()) < 1e-4);
    CHECK(max_abs_diff(k.grad().to(DType::f64), k64.grad()) < 1e-4);
    CHECK(max_abs_diff(v.grad().to(DType::f64), v64.grad()) < 1e-4);
  }
}

TEST_CASE("sdpa work splits match the naive reference and do not depend on the thread count", "[attention]") {
  // The CPU kernels stack the query heads of a kv head per work item (all of the group, or a
  // divisor of it when there are fewer than 16 forward items) and split a kv head's query blocks
  // over up to 4 backward items (each with its own dk / dv, added at the end) when there are
  // fewer than 8 kv items (one more chunk when that makes an odd item count even). Cases: whole group stacked + 2
  // backward chunks; half of a group of 4 stacked + 4 chunks (T = 450: 8 query blocks, 2 key
  // blocks of 256 forward); no backward split (8 kv items); a window with the group stacked; 3 kv
  // items (4 chunks).
  manual_seed(43);
  compare_with_naive(2, 4, 2, 260, 260, 8, true);
  compare_with_naive(1, 4, 1, 450, 450, 8, true);
  compare_with_naive(2, 8, 4, 70, 70, 4, true);
  compare_with_naive(2, 6, 2, 300, 300, 8, true, 70);
  compare_with_naive(1, 4, 1, 130, 200, 8, false);
  compare_with_naive(1, 6, 3, 260, 260, 8, true);  // 3 kv items: 4 chunks (12 items, not 9)
  // f32: 1, 2 and 3 threads give the same bits (the splits follow the shape, not the threads;
  // the items, handed out largest first, here 16 forward and 4 backward ones of unequal cost,
  // each write their own outputs).
  Tensor q = randn({1, 4, 200, 16}), k = randn({1, 1, 200, 16}), v = randn({1, 1, 200, 16});
  auto fw = dispatch(OpCall{op_def("sdpa"), {q, k, v}, {true, 0.25}});
  Tensor g = randn(fw[0].sizes());
  const int saved = omp_get_max_threads();
  std::vector<Tensor> runs[3];
  for (int t = 1; t <= 3; ++t) {
    omp_set_num_threads(t);
    runs[t - 1] = dispatch(OpCall{op_def("sdpa"), {q, k, v}, {true, 0.25}});
    for (const Tensor& d : dispatch(OpCall{op_def("sdpa_backward"), {g, q, k, v, fw[0], fw[1]}, {true, 0.25}}))
      runs[t - 1].push_back(d);
  }
  omp_set_num_threads(saved);
  for (int t = 2; t <= 3; ++t)
    for (size_t i = 0; i < runs[0].size(); ++i) CHECK(max_abs_diff(runs[0][i], runs[t - 1][i]) == 0);
}

TEST_CASE("sdpa f32: the same bits for any thread count with documents and strided inputs, and after scratch reuse",
          "[attention]") {
  // The f32 kernels keep per-thread scratch across calls and split a kv head's query blocks over
  // work items (here 1 kv item: 4 chunks). Their bits must follow the inputs alone: 1, 2 and 3
  // threads on the projections' [B, T, H, D] layout with document ids and a window; a small call
  // after a larger one (scratch grown and reused); calls from the threads of an outer parallel
  // region (each kernel then serial on its thread, with that thread's scratch).
  manual_seed(53);
  auto view = [](int64_t H, int64_t T, int64_t D) { return randn({1, T, H, D}).transpose(1, 2); };
  Tensor q = view(4, 200, 16), k = view(1, 200, 16), v = view(1, 200, 16), g = view(4, 200, 16);
  std::vector<int64_t> ids(200);
  for (int64_t i = 0; i < 200; ++i) ids[i] = i / 37;
  Tensor docs = from_vector<int64_t>(ids, {1, 200});
  auto run = [&](const Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& g_) {
    // attrs {is_causal, scale, window, diagonal}, inputs + document ids
    std::vector<Tensor> r = dispatch(OpCall{op_def("sdpa"), {q_, k_, v_, docs, docs}, {true, 0.25, int64_t{9}, int64_t{0}}});
    for (const Tensor& d : dispatch(OpCall{op_def("sdpa_backward"), {g_, q_, k_, v_, r[0], r[1], docs, docs},
                                           {true, 0.25, int64_t{9}, int64_t{0}}}))
      r.push_back(d);
    return r;
  };
  auto same = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    for (size_t i = 0; i < a.size(); ++i) CHECK(max_abs_diff(a[i], b[i]) == 0);
  };
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<Tensor> ref = run(q, k, v, g);
  for (int t = 2; t <= 3; ++t) {
    omp_set_num_threads(t);
    same(ref, run(q, k, v, g));
  }
  omp_set_num_threads(saved);
  // A larger call (other shapes, more scratch), then the small one again.
  Tensor qb = view(8, 300, 64), kb = view(2, 300, 64), vb = view(2, 300, 64);
  std::vector<int64_t> ids_b(300);
  for (int64_t i = 0; i < 300; ++i) ids_b[i] = i / 100;
  Tensor docs_b = from_vector<int64_t>(ids_b, {1, 300});
  auto fb = dispatch(OpCall{op_def("sdpa"), {qb, kb, vb, docs_b, docs_b}, {true, 0.125, int64_t{0}, int64_t{0}}});
  dispatch(OpCall{op_def("sdpa_backward"), {view(8, 300, 64), qb, kb, vb, fb[0], fb[1], docs_b, docs_b},
                  {true, 0.125, int64_t{0}, int64_t{0}}});
  same(ref, run(q, k, v, g));
  // From the two threads of an outer parallel region, each on its own inputs.
  Tensor q2 = view(4, 200, 16), g2 = view(4, 200, 16);
  const std::vector<Tensor> ref2 = run(q2, k, v, g2);
  std::vector<Tensor> outs[2];
#pragma omp parallel num_threads(2)
  {
    const int t = omp_get_thread_num();
    if (t < 2) outs[t] = t == 0 ? run(q, k, v, g) : run(q2, k, v, g2);
  }
  if (!outs[1].empty()) same(ref2, outs[1]);
  same(ref, outs[0]);
}

TEST_CASE("sdpa with a sliding window matches the masked reference", "[attention]") {
  manual_seed(29);
  // Windows shorter and longer than a key block (128) and a query block (64), S > T (KV cache),
  // a window of 1 (each query sees itself only) and one longer than the sequence (no effect).
  compare_with_naive(1, 2, 1, 12, 12, 8, true, 5);
  compare_with_naive(2, 4, 2, 7, 20, 4, true, 3);
  compare_with_naive(1, 2, 2, 9, 9, 4, true, 1);
  compare_with_naive(1, 2, 1, 300, 300, 8, true, 130);
  compare_with_naive(1, 2, 1, 200, 330, 8, true, 70);
  compare_with_naive(1, 1, 1, 10, 10, 4, true, 64);
  auto f = [](const std::vector<Tensor>& x) {
    return scaled_dot_product_attention(x[0], x[1], x[2], true, std::nullopt, 3);
  };
  CHECK(gradcheck(f, {leaf({1, 2, 6, 4}), leaf({1, 1, 8, 4}), leaf({1, 1, 8, 4})}) == "");
  Tensor q = leaf({1, 1, 3, 4});
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, q, q, false, std::nullopt, 2), Catch::Contains("is_causal"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, q, q, true, std::nullopt, -1), Catch::Contains("negative"));
}

TEST_CASE("sdpa with T > S causal: rows without visible keys are 0", "[attention]") {
  manual_seed(17);
  const int64_t T = 6, S = 4;
  Tensor q = leaf({1, 2, T, 8}), k = leaf({1, 1, S, 8}), v = leaf({1, 1, S, 8});
  Tensor out = scaled_dot_product_attention(q, k, v, true);
  CHECK(out.narrow(2, 0, T - S).to_vector<double>() == std::vector<double>(2 * (T - S) * 8, 0.0));
  Tensor ref = naive_attention(q, k, v, true).narrow(2, T - S, S);
  CHECK(max_abs_diff(out.narrow(2, T - S, S), ref) < 1e-12);
  CHECK(gradcheck([](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true); },
                  {q, k, v}) == "");
}

TEST_CASE("sdpa backward matches finite differences", "[attention][grad]") {
  manual_seed(19);
  auto f = [](bool causal) {
    return [causal](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal); };
  };
  CHECK(gradcheck(f(true), {leaf({1, 4, 3, 4}), leaf({1, 2, 5, 4}), leaf({1, 2, 5, 4})}) == "");
  CHECK(gradcheck(f(false), {leaf({1, 4, 3, 4}), leaf({1, 2, 5, 4}), leaf({1, 2, 5, 4})}) == "");
  // v with a different head dim
  CHECK(gradcheck(f(true), {leaf({1, 2, 3, 4}), leaf({1, 1, 3, 4}), leaf({1, 1, 3, 2})}) == "");
  // non-contiguous: [B, T, H, D] tensors transposed to [B, H, T, D]
  CHECK(gradcheck(
            [](const std::vector<Tensor>& x) {
              return scaled_dot_product_attention(x[0].transpose(1, 2), x[1].transpose(1, 2), x[2].transpose(1, 2),
                                                  true);
            },
            {leaf({1, 3, 2, 4}), leaf({1, 4, 1, 4}), leaf({1, 4, 1, 4})}) == "");
  // empty query length
  CHECK(scaled_dot_product_attention(leaf({1, 2, 0, 4}), leaf({1, 2, 3, 4}), leaf({1, 2, 3, 4})).sizes() ==
        Shape{1, 2, 0, 4});
}

namespace {

/// The model's attention core on projection outputs [B, T, H * D]: view to [B, T, H, D],
/// transpose to [B, H, T, D], RoPE on q and k, causal sdpa, back to [B, T, Hq * D]. `copies`
/// makes every [B, H, T, D] operand contiguous first (the layout the kernels saw before they
/// read the projections in place), the reference of the strided path.
Tensor attention_core(const Tensor& q2, const Tensor& k2, const Tensor& v2, int64_t D, const Tensor& cos,
                      const Tensor& sin, bool copies) {
  const int64_t B = q2.size(0), T = q2.size(1);
  auto heads = [&](const Tensor& x) {
    Tensor t = transpose(view(x, {B, T, -1, D}), 1, 2);
    return copies ? contiguous(t) : t;
  };
  Tensor q = rotary_embedding(heads(q2), cos, sin), k = rotary_embedding(heads(k2), cos, sin), v = heads(v2);
  if (copies) q = contiguous(q), k = contiguous(k);
  Tensor o = scaled_dot_product_attention(q, k, v, true);
  if (copies) o = contiguous(o);
  return reshape(transpose(o, 1, 2), {B, T, -1});
}

/// Calls of layout-copy ops in the op profile.
int64_t copy_calls() {
  int64_t n = 0;
  for (const OpProfileEntry& e : op_profile())
    if (e.name == "clone" || e.name == "contiguous" || e.name == "copy_") n += e.calls;
  return n;
}

}  // namespace

TEST_CASE("sdpa and rope on the projections' [B, T, H, D] layout: no copies, results of contiguous inputs",
          "[attention][rope][grad]") {
  // GQA (Hq 6, Hkv 2; Hq 3, Hkv 1), T not a multiple of the 64-query / 128-key blocks, T = 5.
  manual_seed(37);
  struct Case { int64_t B, Hq, Hkv, T, D; };
  for (const Case& c : {Case{2, 6, 2, 70, 8}, Case{1, 3, 1, 5, 4}, Case{1, 4, 4, 130, 6}}) {
    INFO("B=" << c.B << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " T=" << c.T << " D=" << c.D);
    auto [cos, sin] = rope_tables(c.T, c.D, 10000.0, 0, DType::f64);
    std::vector<Tensor> in{leaf({c.B, c.T, c.Hq * c.D}), leaf({c.B, c.T, c.Hkv * c.D}), leaf({c.B, c.T, c.Hkv * c.D})};
    Tensor w = randn({c.B, c.T, c.Hq * c.D}, DType::f64);
    std::vector<Tensor> grads[2], outs(2);
    for (int copies = 0; copies < 2; ++copies) {
      reset_op_profile();
      {
        OpProfilerScope prof;
        outs[copies] = attention_core(in[0], in[1], in[2], c.D, cos, sin, copies == 1);
        sum(mul(outs[copies], w)).backward();
      }
      if (copies == 0) {
        CHECK(copy_calls() == 0);  // forward and backward: every transpose / reshape is a view
        CHECK(outs[0].is_contiguous());
      } else {
        CHECK(copy_calls() > 0);  // the reference does copy
      }
      for (Tensor& x : in) {
        if (copies == 0) CHECK(x.grad().is_contiguous());  // the gradients arrive in the projections' layout
        grads[copies].push_back(x.grad());
        x.set_grad(Tensor());
      }
    }
    // Same kernels, same summation order: equal up to f64 rounding of the strided reads.
    CHECK(max_abs_diff(outs[0], outs[1]) < 1e-13);
    for (int i = 0; i < 3; ++i) CHECK(max_abs_diff(grads[0][i], grads[1][i]) < 1e-12);
    // The strided path's gradients against finite differences (a shorter T, uneven: 9 or 5).
    const int64_t Tg = std::min<int64_t>(c.T, 9);
    auto [cg, sg] = rope_tables(Tg, c.D, 10000.0, 0, DType::f64);
    CHECK(gradcheck([D = c.D, cg = cg, sg = sg](const std::vector<Tensor>& x) {
            return attention_core(x[0], x[1], x[2], D, cg, sg, false);
          },
                    {leaf({1, Tg, c.Hq * c.D}), leaf({1, Tg, c.Hkv * c.D}), leaf({1, Tg, c.Hkv * c.D})}) == "");
  }
}

TEST_CASE("sdpa outputs: [B, T, Hq, Dv] memory order, gradients in the inputs' layout", "[attention]") {
  manual_seed(41);
  const Tensor q = randn({2, 3, 7, 4}, DType::f64), k = randn({2, 7, 3, 4}, DType::f64).transpose(1, 2);
  const Tensor v = randn({2, 3, 7, 4}, DType::f64);
  std::vector<Tensor> f = dispatch(OpCall{op_def("sdpa"), {q, k, v}, {true, 0.5}});
  CHECK(transpose(f[0], 1, 2).is_contiguous());  // out [B, Hq, T, Dv] lies as [B, T, Hq, Dv]
  std::vector<Tensor> b =
      dispatch(OpCall{op_def("sdpa_backward"), {randn(f[0].sizes(), DType::f64), q, k, v, f[0], f[1]}, {true, 0.5}});
  CHECK(b[0].is_contiguous());                   // dq like q
  CHECK(transpose(b[1], 1, 2).is_contiguous());  // dk like k: [B, T, H, D] memory
  CHECK(b[2].is_contiguous());                   // dv like v
}

TEST_CASE("sdpa low precision keeps lse in f32", "[attention]") {
  manual_seed(23);
  Tensor q = randn({1, 2, 5, 8}), k = randn({1, 2, 5, 8}), v = randn({1, 2, 5, 8});
  auto outs = dispatch(OpCall{op_def("sdpa"), {to_dtype(q, DType::bf16), to_dtype(k, DType::bf16),
                                               to_dtype(v, DType::bf16)}, {true, 1.0 / std::sqrt(8.0)}});
  CHECK(outs[0].dtype() == DType::bf16);
  CHECK(outs[1].dtype() == DType::f32);
  Tensor ref = scaled_dot_product_attention(q, k, v, true);
  CHECK(max_abs_diff(to_dtype(outs[0], DType::f32), ref) < 5e-2);  // bf16 inputs and output rounding
}

TEST_CASE("sdpa errors", "[attention]") {
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({1, 3, 2, 4}), zeros({1, 2, 2, 4}), zeros({1, 2, 2, 4})),
                    Catch::Contains("Hq=3") && Catch::Contains("Hkv=2"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({1, 2, 2, 4}), zeros({1, 2, 2, 5}), zeros({1, 2, 2, 4})),
                    Catch::Contains("head dim"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({2, 4}), zeros({2, 4}), zeros({2, 4})),
                    Catch::Contains("[B, Hq, T, D]"));
}
