// CUDA softmax / log_softmax kernels (tensor/ops/cuda/softmax.cu) against the CPU backend:
// the last dim (one block per row) and other dims (one thread per line), rows of 1, 7, 1031
// and 49152 (a vocabulary), masked (-inf) entries, non-contiguous inputs; f32 and bf16;
// forward and backward.
#include <limits>

#include "cuda_test_util.h"

using namespace dtr;

namespace {

// bf16 backward: y * (g - sum(g * y)) subtracts two bf16-rounded terms; allow ~3 ulps.
constexpr double kBf16BackwardTol = 3e-2;

Tensor leaf(const Shape& shape, DType dt) {
  return uniform(shape, -4.0, 4.0, TensorOptions(DType::f32)).to(dt).set_requires_grad(true);
}
double tol(DType dt) { return dt == DType::bf16 ? kBf16BackwardTol : testing::atol_for(dt); }

}  // namespace

TEST_CASE("cuda softmax and log_softmax match the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  struct Case {
    Shape shape;
    int64_t dim;
  };
  const std::vector<Case> cases = {{{1}, 0},       {{7}, 0},        {{1031}, -1},   {{7, 1031}, 1}, {{7, 1031}, 0},
                                   {{3, 5, 7}, 1}, {{3, 1, 5}, 1},  {{2, 49152}, -1}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : cases) {
      INFO("dtype " << dt << " shape " << detail::cat(c.shape) << " dim " << c.dim);
      const Tensor x = leaf(c.shape, dt);
      const int64_t d = c.dim;
      testing::check_cuda_matches_cpu(
          [d](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax(in[0], d), log_softmax(in[0], d)}; },
          {x}, tol(dt), tol(dt));
    }
  }
}

TEST_CASE("cuda softmax of masked and non-contiguous inputs matches the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("dtype " << dt);
    const Tensor x = leaf({33, 7}, dt);
    // Causal-style mask: row i keeps columns <= i (every row keeps at least one entry).
    std::vector<uint8_t> m(7 * 33);
    for (int i = 0; i < 7; ++i)
      for (int j = 0; j < 33; ++j) m[i * 33 + j] = j > i;
    const Tensor mask = from_vector<uint8_t>(m, {7, 33}, TensorOptions(DType::bool_));
    testing::check_cuda_matches_cpu(
        [](const std::vector<Tensor>& in) {
          const Tensor t = in[0].transpose(0, 1);  // [7, 33] non-contiguous
          const Tensor masked = masked_fill(t, in[1], -std::numeric_limits<double>::infinity());
          return std::vector<Tensor>{softmax(masked, -1), log_softmax(t, 0), softmax(t, 1)};
        },
        {x, mask}, tol(dt), tol(dt));
  }
}
