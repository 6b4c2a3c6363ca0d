#include "bench/ops.h"

#include <omp.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/dispatch.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr::bench {
namespace {

/// sdpa and sdpa_backward (causal, GQA 9 query / 3 kv heads, head dim 64) at [B, 9, T, 64]:
/// GFLOP/s of each, the backward (dq, dk, dv, dP) counted as twice the forward's FLOPs. `bthd`:
/// q / k / v / g as the [B, H, T, D] views of [B, T, H, D] tensors. Median of `reps`.
void sdpa_row(const char* name, int64_t B, int64_t T, int reps, bool bthd) {
  auto heads = [&](int64_t H) { return bthd ? transpose(randn({B, T, H, 64}), 1, 2) : randn({B, H, T, 64}); };
  Tensor q = heads(9), k = heads(3), v = heads(3), g = heads(9);
  const OpDef* fw = op_def("sdpa");
  const OpDef* bw = op_def("sdpa_backward");
  auto fo = dispatch(OpCall{fw, {q, k, v}, {true, 0.125}});
  const double tf = median_seconds([&] { auto o = dispatch(OpCall{fw, {q, k, v}, {true, 0.125}}); }, reps);
  const double tb = median_seconds([&] { auto d = dispatch(OpCall{bw, {g, q, k, v, fo[0], fo[1]}, {true, 0.125}}); }, reps);
  const double f = 4.0 * B * 9 * T * (T + 1) / 2 * 64;
  std::printf("  %-26s %10.2f GFLOP/s\n", (std::string("sdpa causal ") + name).c_str(), f / tf * 1e-9);
  std::printf("  %-26s %10.2f GFLOP/s\n", (std::string("sdpa_backward ") + name).c_str(), 2 * f / tb * 1e-9);
}

}  // namespace

int bench_ops(int argc, char** argv) {
  (void)argc;
  (void)argv;
  manual_seed(3);
  std::printf("dtr-bench ops: %d threads, median of 7\n\n", omp_get_max_threads());
  // 1. Overhead on tiny tensors.
  Tensor a = randn({4}), b = randn({4});
  Tensor ga = randn({4}).set_requires_grad(true);
  const int inner = 20000;
  const double t_add = median_seconds([&] { NoGradGuard ng; Tensor c = add(a, b); }, 7, inner);
  const double t_add_grad = median_seconds([&] { Tensor c = add(ga, b); }, 7, inner);
  const double t_mul_s = median_seconds([&] { NoGradGuard ng; Tensor c = mul(a, 2.0); }, 7, inner);
  const double t_view = median_seconds([&] { NoGradGuard ng; Tensor c = a.view({2, 2}); }, 7, inner);
  std::vector<float> x(4), y(4), z(4);
  const double t_raw = median_seconds([&] { for (int i = 0; i < 4; ++i) z[i] = x[i] + y[i]; }, 7, inner);
  std::printf("per-op overhead on [4] f32 (us)\n");
  std::printf("  add (no grad)             %8.3f\n", t_add * 1e6);
  std::printf("  add (autograd recording)  %8.3f\n", t_add_grad * 1e6);
  std::printf("  mul scalar (no grad)      %8.3f\n", t_mul_s * 1e6);
  std::printf("  view (no grad)            %8.3f\n", t_view * 1e6);
  std::printf("  raw loop                  %8.3f\n\n", t_raw * 1e6);
  // 2. Fused kernel throughput vs memcpy of the bytes each kernel must read + write.
  NoGradGuard ng;
  const int64_t rows = 2048, H = 576, V = 8192;
  Tensor xh = randn({rows, H}), w = ones({H});
  Tensor logits = randn({512, V});
  Tensor tgt = full({512}, 3.0, TensorOptions(DType::i64));
  Tensor q = randn({1, 9, 256, 64}), k = randn({1, 3, 256, 64}), v = randn({1, 3, 256, 64});
  // Llama MLP gating: [tokens, intermediate] = [2048, 1536] (SmolLM2-135M).
  const int64_t I = 1536;
  Tensor gt = randn({rows, I}), ut = randn({rows, I}), gg = randn({rows, I});
  Tensor st = silu(gt);  // the unfused backward reuses the saved silu output, as autograd does
  const OpDef* swiglu_bw = op_def("swiglu_backward");
  const OpDef* silu_bw = op_def("silu_backward");
  const OpDef* rms_bw = op_def("rms_norm_backward");
  const OpDef* rope_bw = op_def("rotary_embedding_backward");
  const OpDef* ce_bw = op_def("cross_entropy_backward");
  Tensor qv = randn({4, 256, 9, 64}).transpose(1, 2);
  auto [rc, rs] = rope_tables(256, 64, 10000.0, 0, DType::f32);
  Tensor one = ones({});
  const size_t qb = static_cast<size_t>(qv.numel()) * 4;
  auto memcpy_gbs = [&](size_t bytes) {
    std::vector<char> src(bytes, 1), dst(bytes);
    const double t = median_seconds([&] { std::memcpy(dst.data(), src.data(), bytes); });
    return static_cast<double>(bytes) / t * 1e-9;
  };
  struct Row {
    const char* name;
    size_t bytes;
    std::function<void()> fn;
  };
  const size_t xb = static_cast<size_t>(rows * H) * 4, lb = static_cast<size_t>(512 * V) * 4;
  const size_t ib = static_cast<size_t>(rows * I) * 4;  // one [2048,1536] f32 array
  std::vector<Row> rows_{
      {"add [2048,576]", 3 * xb, [&] { Tensor c = add(xh, xh); }},
      {"silu [2048,576]", 2 * xb, [&] { Tensor c = silu(xh); }},
      // Fused vs unfused SwiGLU, both rated on the fused op's bytes (forward: read gate, up,
      // write out; backward: read g, gate, up, write dgate, dup), so GB/s compares times.
      {"swiglu [2048,1536]", 3 * ib, [&] { Tensor c = swiglu(gt, ut); }},
      {"silu+mul (unfused)", 3 * ib, [&] { Tensor c = mul(silu(gt), ut); }},
      {"swiglu_backward", 5 * ib, [&] { auto d = dispatch(OpCall{swiglu_bw, {gg, gt, ut}, {}}); }},
      {"mul,mul,silu_bw (unfused)", 5 * ib,
       [&] {
         Tensor du = mul(gg, st);
         Tensor dg = dispatch1(OpCall{silu_bw, {mul(gg, ut), gt}, {}});
       }},
      {"rms_norm [2048,576]", 2 * xb, [&] { Tensor c = rms_norm(xh, w, 1e-5); }},
      {"rms_norm_backward", 3 * xb, [&] { auto d = dispatch(OpCall{rms_bw, {xh, xh, w}, {1e-5}}); }},
      // q of the LoRA step: [B, T, H, D] = [4, 256, 9, 64] read as the [B, H, T, D] view.
      {"rotary_embedding q view", 2 * qb, [&] { Tensor c = rotary_embedding(qv, rc, rs); }},
      {"rotary_embedding_backward", 2 * qb, [&] { auto d = dispatch(OpCall{rope_bw, {qv, rc, rs}, {}}); }},
      {"softmax [2048,576]", 2 * xb, [&] { Tensor c = softmax(xh, -1); }},
      {"cross_entropy [512,8192]", lb, [&] { Tensor c = cross_entropy(logits, tgt); }},
      {"cross_entropy_backward", 2 * lb, [&] { auto d = dispatch(OpCall{ce_bw, {one, logits, tgt}, {int64_t{-100}}}); }},
  };
  std::printf("fused kernels: GB/s (bytes read+written / time) vs memcpy of the same bytes\n");
  std::printf("  %-26s %10s %10s %8s\n", "kernel", "GB/s", "memcpy", "ratio");
  for (auto& r : rows_) {
    const double t = median_seconds(r.fn);
    const double gbs = static_cast<double>(r.bytes) / t * 1e-9;
    const double mc = memcpy_gbs(r.bytes / 2);
    std::printf("  %-26s %10.2f %10.2f %8.2f\n", r.name, gbs, mc, gbs / mc);
  }
  const double flops = 4.0 * 9 * 256 * 256 * 64 / 2;  // causal: half the scores
  const double t_sdpa = median_seconds([&] { Tensor o = scaled_dot_product_attention(q, k, v, true); });
  std::printf("  %-26s %10.2f GFLOP/s\n", "sdpa causal 9x256x64 GQA3", flops / t_sdpa * 1e-9);
  // The LoRA step's [4, 9, 256, 64] and seq 2048 at batch 1 (GQA 9/3; q / k / v / g in the
  // projections' [B, T, H, D] layout).
  sdpa_row("4x9x256x64", 4, 256, 7, false);
  sdpa_row("1x9x2048x64", 1, 2048, 5, true);
  return 0;
}

}  // namespace dtr::bench
