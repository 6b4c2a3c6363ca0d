// Fused AdamW on CUDA parameters (op "adamw_update", tensor/ops/cuda/adamw.cu) against the CPU
// step: same math per element; f32, bf16 and f64 parameters, f32 and bf16 gradients, several
// steps, uneven sizes.
#include "cuda_test_util.h"
#include "tensor/optim/adamw.h"

using namespace dtr;

namespace {

// Per step the CPU and the GPU may differ by an FMA contraction (last bit of f32); over 3 steps
// of lr 1e-2 that stays far below 1e-6 relative. bf16 parameters round once per step: one ulp.
double tol(DType dt) { return dt == DType::f32 ? 1e-6 : dt == DType::f64 ? 1e-12 : 1e-2; }

}  // namespace

TEST_CASE("cuda AdamW step matches the CPU step", "[cuda]") {
  DTR_REQUIRE_CUDA();
  struct Case {
    DType param, grad;
  };
  for (const Case& c : {Case{DType::f32, DType::f32}, Case{DType::bf16, DType::bf16}, Case{DType::bf16, DType::f32},
                        Case{DType::f64, DType::f64}}) {
    for (const Shape& shape : {Shape{1}, Shape{7, 1031}}) {
      INFO("param " << c.param << " grad " << c.grad << " shape " << detail::cat(shape));
      const Tensor init = uniform(shape, -1.0, 1.0).to(c.param);
      Tensor pc = init.clone(), pg = init.to(testing::cuda_device());
      pc.set_requires_grad(true);
      pg.set_requires_grad(true);
      optim::AdamWOptions o;
      o.lr = 1e-2;
      o.weight_decay = 0.1;
      optim::AdamW oc(std::vector<Tensor>{pc}, o), og(std::vector<Tensor>{pg}, o);
      for (int step = 0; step < 3; ++step) {
        const Tensor g = uniform(shape, -1.0, 1.0).to(c.grad);
        pc.set_grad(g);
        pg.set_grad(g.to(testing::cuda_device()));
        oc.step();
        og.step();
      }
      CHECK(testing::compare_with_cpu(pg.detach(), pc.detach(), tol(c.param), tol(c.param), "parameter") == "");
    }
  }
}
