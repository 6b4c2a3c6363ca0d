// grouped_mm on CUDA (per-group cuBLASLt) against the CPU kernel: both forms, empty groups, a
// transposed (HF [E, out, in]) weight, f64 / f32 / bf16, forward and backward; and the whole
// nn::MoE block (host routing, row gathers, grouped experts) on CUDA against the CPU.
#include "cuda_test_util.h"
#include "tensor/nn/moe.h"

using namespace dtr;

namespace {
using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
/// Sums of K = 24 products of N(0, 1) values: outputs ~5, so atol scales like a GEMM's.
double atol_k(DType dt) { return testing::atol_for(dt) * 5; }
}  // namespace

TEST_CASE("grouped_mm on CUDA matches the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Shape sizes{5, 0, 9, 1};
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    const TensorOptions o = TensorOptions(dt).with_requires_grad();
    const Fn f23 = [sizes](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{grouped_mm(in[0], in[1].transpose(1, 2), sizes)};
    };
    testing::check_cuda_matches_cpu(f23, {randn({15, 24}, o), randn({4, 16, 24}, o)}, atol_k(dt), testing::rtol_for(dt));
    const Fn f22 = [sizes](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{grouped_mm(in[0].t(), in[1], sizes)};
    };
    testing::check_cuda_matches_cpu(f22, {randn({15, 24}, o), randn({15, 16}, o)}, atol_k(dt), testing::rtol_for(dt));
  }
}

TEST_CASE("MoE block on CUDA matches the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  nn::MoEConfig c;
  c.hidden_size = 24;
  c.moe_intermediate_size = 16;
  c.num_experts = 6;
  c.num_experts_per_tok = 2;
  auto m = std::make_shared<nn::MoE>(c, DType::f64, false);
  const TensorOptions o = TensorOptions(DType::f64).with_requires_grad();
  const Fn f = [m](const std::vector<Tensor>& in) {
    m->set_parameter("gate.weight", in[1]);
    m->set_parameter("experts.gate_up_proj", in[2]);
    m->set_parameter("experts.down_proj", in[3]);
    return std::vector<Tensor>{m->call(in[0])};
  };
  testing::check_cuda_matches_cpu(f, {randn({2, 7, 24}, o), randn({6, 24}, o), randn({6, 32, 24}, o),
                                      randn({6, 24, 16}, o)},
                                  1e-9, 1e-9);
}
