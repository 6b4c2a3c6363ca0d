// The fused CUDA attention kernels (tensor/ops/cuda/attention*.cu) against the CPU backend:
// scaled_dot_product_attention forward and backward (dq, dk, dv through autograd, which runs
// op sdpa_backward), and the raw op "sdpa" for the f32 logsumexp the backward relies on.
// Cases cover: causal and not, GQA groups 9/3 and 4/1 (and 2/2), head dims 64 and 128 and
// padded ones (48 -> 64, 100 -> 128, Dv != D), T = 1 / 17 / 256 (tile tails), S_q < S_k (KV
// cache, bottom-right causal), S_q > S_k (leading rows see no key: output and grads 0), a
// custom scale, and strided inputs (the [B, T, H, D] -> [B, H, T, D] transpose of the models).
// bf16 / f16 run the tensor-core forward by default and the CUDA-core one under
// DTR_CUDA_SDPA_SIMPLE=1; both are checked. Every test skips with a warning where no GPU is present.
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "cuda_test_util.h"
#include "tensor/dispatch.h"
#include "tensor/random.h"

using namespace dtr;

namespace {

// Tolerances, |cuda - cpu| <= atol + rtol |cpu|:
// f32: both backends compute the same formula in f32 but sum in different orders (the CPU over
//   blocks of 64 keys through Eigen, the GPU per thread in another order), and the backward sums
//   dk/dv over up to group * T = 768 query rows: a few 1e-6 relative; 1e-4 leaves a margin.
constexpr double kAtolF32 = 1e-4, kRtolF32 = 1e-4;
// bf16 / f16: the inputs are the same low-precision values on both sides and all arithmetic is
//   f32; each output is rounded once. But the forward output is rounded before the backward
//   uses it (Di = rowsum(dO * O)), so a one-ulp difference in O (2^-8 for bf16) moves Di and
//   every dS = P (dP - Di) of the row: the gradients get about two ulps of slack more than the
//   harness default (1e-2 for bf16, 1e-3 for f16). The tensor-core forward also rounds P to the
//   input dtype before P V (FlashAttention-2 does the same): a relative 2^-9 (bf16) / 2^-12
//   (f16) per term, averaged over the keys; measured in the CPU emulation of the kernels at up
//   to one output ulp.
constexpr double kAtolBf16 = 2e-2, kRtolBf16 = 2e-2;
constexpr double kAtolF16 = 3e-3, kRtolF16 = 3e-3;

double atol_of(DType dt) { return dt == DType::bf16 ? kAtolBf16 : dt == DType::f16 ? kAtolF16 : kAtolF32; }
double rtol_of(DType dt) { return dt == DType::bf16 ? kRtolBf16 : dt == DType::f16 ? kRtolF16 : kRtolF32; }

struct Case {
  int64_t B, Hq, Hkv, T, S, D, Dv;
  bool causal;
  std::optional<double> scale;
};

std::string describe(const Case& c, DType dt) {
  std::ostringstream os;
  os << dt << " B=" << c.B << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " T=" << c.T << " S=" << c.S << " D=" << c.D
     << " Dv=" << c.Dv << (c.causal ? " causal" : " full") << (c.scale ? " scale=" + std::to_string(*c.scale) : "");
  return os.str();
}

/// q, k, v leaves (CPU, dtype dt, requires grad) of case `c`, values ~ N(0, 1).
std::vector<Tensor> make_qkv(const Case& c, DType dt) {
  const TensorOptions opt = TensorOptions(dt).with_requires_grad();
  return {randn({c.B, c.Hq, c.T, c.D}, opt), randn({c.B, c.Hkv, c.S, c.D}, opt), randn({c.B, c.Hkv, c.S, c.Dv}, opt)};
}

/// Forward and backward of scaled_dot_product_attention on CUDA vs CPU.
void check_case(const Case& c, DType dt) {
  INFO(describe(c, dt));
  manual_seed(1234);
  const bool causal = c.causal;
  const std::optional<double> scale = c.scale;
  testing::check_cuda_matches_cpu(
      [causal, scale](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], causal, scale)};
      },
      make_qkv(c, dt), atol_of(dt), rtol_of(dt));
}

}  // namespace

TEST_CASE("cuda sdpa: f32 forward and backward match the CPU", "[cuda][attention]") {
  DTR_REQUIRE_CUDA();
  const Case cases[] = {
      {1, 9, 3, 256, 256, 64, 64, true, {}},   // GQA 9/3, several tiles, diagonal tiles
      {1, 9, 3, 256, 256, 64, 64, false, {}},  //
      {2, 4, 1, 17, 17, 128, 128, true, {}},   // GQA 4/1, one partial tile, head dim 128
      {2, 4, 1, 17, 17, 128, 128, false, {}},  //
      {1, 4, 1, 1, 1, 48, 48, true, {}},       // S = 1, head dim 48 padded to 64
      {2, 9, 3, 1, 37, 64, 64, true, {}},      // one decode step against a KV cache
      {1, 4, 1, 17, 80, 128, 128, true, {}},   // S_q < S_k across two key tiles
      {1, 4, 2, 80, 17, 48, 48, true, {}},     // S_q > S_k: rows 0..62 see no key
      {1, 2, 2, 130, 130, 100, 100, false, {}},  // head dim 100 padded to 128, 3 query tiles
      {1, 4, 2, 33, 45, 64, 32, true, 0.3},    // Dv != D, custom scale
  };
  for (const Case& c : cases) check_case(c, DType::f32);
}

TEST_CASE("cuda sdpa: bf16 forward and backward match the CPU", "[cuda][attention]") {
  DTR_REQUIRE_CUDA();
  const Case cases[] = {
      {1, 9, 3, 256, 256, 128, 128, true, {}},  // the Llama shape family: GQA, head dim 128
      {1, 4, 1, 256, 256, 64, 64, false, {}},   //
      {2, 9, 3, 17, 17, 48, 48, true, {}},      // padded head dim, partial tile
      {1, 4, 1, 1, 1, 64, 64, true, {}},        // S = 1
      {2, 4, 1, 1, 300, 128, 128, true, {}},    // decode step, 5 key tiles
      {1, 4, 2, 17, 70, 64, 64, true, {}},      // S_q < S_k
  };
  for (const Case& c : cases) check_case(c, DType::bf16);
}

TEST_CASE("cuda sdpa: document ids and offsets match the CPU", "[cuda][attention][packing]") {
  DTR_REQUIRE_CUDA();
  manual_seed(4321);
  // Documents that start and end inside the 64-row tiles, one spanning three; GQA 4/2.
  std::vector<int64_t> ids;
  for (int64_t n : {5, 70, 1, 60, 3, 61})
    for (int64_t t = 0; t < n; ++t) ids.push_back(static_cast<int64_t>(ids.empty() ? 0 : ids.back() + (t == 0)));
  const Tensor docs = from_vector<int64_t>(ids, {1, 200});
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t window : {0, 7}) {
      INFO(dt << " window=" << window);
      const TensorOptions opt = TensorOptions(dt).with_requires_grad();
      testing::check_cuda_matches_cpu(
          [&](const std::vector<Tensor>& in) {
            SdpaMask m;
            m.q_document_ids = docs.to(in[0].device());
            return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], true, std::nullopt, window, m)};
          },
          {randn({1, 4, 200, 64}, opt), randn({1, 2, 200, 64}, opt), randn({1, 2, 200, 64}, opt)}, atol_of(dt),
          rtol_of(dt));
      // A query chunk [70, 200) against all keys (context-parallel offsets), with its documents.
      testing::check_cuda_matches_cpu(
          [&](const std::vector<Tensor>& in) {
            SdpaMask m;
            m.q_offset = 70;
            m.q_document_ids = docs.narrow(1, 70, 130).contiguous().to(in[0].device());
            m.k_document_ids = docs.to(in[0].device());
            return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], true, std::nullopt, window, m)};
          },
          {randn({1, 4, 130, 64}, opt), randn({1, 2, 200, 64}, opt), randn({1, 2, 200, 64}, opt)}, atol_of(dt),
          rtol_of(dt));
    }
}

TEST_CASE("cuda sdpa: bf16 / f16 CUDA-core forward (DTR_CUDA_SDPA_SIMPLE=1) matches the CPU", "[cuda][attention]") {
  DTR_REQUIRE_CUDA();
  struct EnvGuard {  // the op reads the variable on every call
    EnvGuard() { setenv("DTR_CUDA_SDPA_SIMPLE", "1", 1); }
    ~EnvGuard() { unsetenv("DTR_CUDA_SDPA_SIMPLE"); }
  } env;
  check_case({1, 9, 3, 256, 256, 128, 128, true, {}}, DType::bf16);
  check_case({2, 4, 2, 17, 70, 48, 48, true, {}}, DType::bf16);
  check_case({1, 4, 2, 70, 70, 64, 64, false, {}}, DType::f16);
}

TEST_CASE("cuda sdpa: f16 forward and backward match the CPU", "[cuda][attention]") {
  DTR_REQUIRE_CUDA();
  const Case cases[] = {
      {1, 4, 2, 70, 70, 64, 64, true, {}},
      {1, 4, 1, 17, 40, 128, 128, true, {}},
  };
  for (const Case& c : cases) check_case(c, DType::f16);
}

TEST_CASE("cuda sdpa: logsumexp output matches the CPU (f32, also for rows that see no key)", "[cuda][attention]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (bool causal : {true, false}) {
      const Case c{2, 9, 3, 70, 40, 64, 64, causal, {}};  // causal: rows 0..29 see no key (lse -inf)
      INFO(describe(c, dt));
      manual_seed(7);
      static const OpDef* op = op_def("sdpa");
      const double scale = 1.0 / std::sqrt(64.0);
      testing::check_cuda_matches_cpu(
          [causal, scale](const std::vector<Tensor>& in) {
            std::vector<Tensor> outs = dispatch(OpCall{op, {in[0], in[1], in[2]}, {causal, scale}});
            REQUIRE(outs.size() == 2);
            CHECK(outs[1].dtype() == DType::f32);  // lse is never rounded to low precision
            return outs;
          },
          make_qkv(c, dt), atol_of(dt), rtol_of(dt), /*check_backward=*/false);
    }
  }
}

TEST_CASE("cuda sdpa: strided inputs (q, k, v as transposed [B, T, H, D] views)", "[cuda][attention]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(dt);
    manual_seed(99);
    const TensorOptions opt = TensorOptions(dt).with_requires_grad();
    const std::vector<Tensor> in = {randn({2, 33, 6, 64}, opt), randn({2, 33, 2, 64}, opt), randn({2, 33, 2, 64}, opt)};
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& x) {
          return std::vector<Tensor>{
              scaled_dot_product_attention(transpose(x[0], 1, 2), transpose(x[1], 1, 2), transpose(x[2], 1, 2), true)};
        },
        in, atol_of(dt), rtol_of(dt));
  }
}

TEST_CASE("cuda sdpa: float64 and head dim > 128 are rejected with a clear error", "[cuda][attention]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  {
    const Tensor q = randn({1, 2, 4, 16}, TensorOptions(DType::f64)).to(dev);
    const Tensor k = randn({1, 2, 4, 16}, TensorOptions(DType::f64)).to(dev);
    CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, k, true), Catch::Contains("not supported on CUDA"));
  }
  {
    const Tensor q = randn({1, 2, 4, 192}, TensorOptions(DType::f32)).to(dev);
    CHECK_THROWS_WITH(scaled_dot_product_attention(q, q, q, true), Catch::Contains("head dims must be in [1, 128]"));
  }
}
