// The strided indexing of the CUDA kernels (tensor/ops/cuda/offset_calc.h), checked on the host
// (runs without a GPU): after coalescing, OffsetCalc::get(i) gives for every row-major index i
// the same element offsets as brute-force indexing with the original strides, for contiguous,
// transposed, sliced (step), broadcast (stride 0) and size-1 operands.
#include "cuda_test_util.h"
#include "tensor/ops/cpu/loops.h"
#include "tensor/ops/cuda/offset_calc.h"

using namespace dtr;

namespace {

/// Checks oc against brute force for operands with `strides` over `shape`; returns mismatches.
template <int N>
int64_t mismatches(const Shape& shape, const std::array<Shape, N>& strides) {
  const auto oc = cuda_ops::make_offset_calc<N>(shape, strides, "test");
  const int64_t n = shape_numel(shape);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t expect[N] = {};
    int64_t rem = i;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      const int64_t idx = rem % shape[d];
      rem /= shape[d];
      for (int k = 0; k < N; ++k) expect[k] += idx * strides[k][d];
    }
    int64_t got[N];
    oc.get(i, got);
    for (int k = 0; k < N; ++k) bad += got[k] != expect[k];
  }
  return bad;
}

}  // namespace

TEST_CASE("OffsetCalc matches brute-force strided indexing", "[cuda]") {
  const Tensor base = zeros({6, 5, 4});
  const Tensor contig = zeros({5, 4, 6});
  struct Case {
    const char* what;
    Tensor a, b;
  };
  const std::vector<Case> cases = {
      {"contiguous", contig, contig},
      {"permuted", base.permute({1, 2, 0}), contig},
      {"transposed + broadcast row", base.permute({1, 2, 0}), zeros({6})},
      {"sliced with step", slice(zeros({5, 12, 6}), 1, 1, 12, 3), contig},
      {"broadcast column and size-1 dims", zeros({5, 1, 1}), zeros({1, 4, 6}).transpose(1, 2).transpose(1, 2)},
      {"narrowed last dim", narrow(zeros({5, 4, 9}), 2, 2, 6), contig.transpose(0, 1).transpose(0, 1)},
  };
  const Shape shape = {5, 4, 6};
  for (const Case& c : cases) {
    INFO(c.what);
    const Shape out = contiguous_strides(shape);
    CHECK(mismatches<3>(shape, {out, cpu::broadcast_strides(c.a, shape), cpu::broadcast_strides(c.b, shape)}) == 0);
    CHECK(mismatches<2>(shape, {cpu::broadcast_strides(c.a, shape), out}) == 0);
  }
  // Shapes with 1s everywhere and a 0-d shape.
  CHECK(mismatches<2>({1, 7, 1, 3, 1}, {contiguous_strides({1, 7, 1, 3, 1}), Shape{0, 1, 0, 7, 0}}) == 0);
  CHECK(mismatches<1>({}, {Shape{}}) == 0);
  CHECK(mismatches<2>({2, 3, 2, 3, 2, 3}, {contiguous_strides({2, 3, 2, 3, 2, 3}), Shape{1, 2, 6, 12, 36, 72}}) == 0);
}

TEST_CASE("make_offset_calc marks dense operands contiguous and refuses too many dims", "[cuda]") {
  const Shape shape = {3, 4, 5};
  CHECK(cuda_ops::make_offset_calc<2>(shape, {contiguous_strides(shape), contiguous_strides(shape)}, "t").contiguous);
  CHECK_FALSE(cuda_ops::make_offset_calc<2>(shape, {contiguous_strides(shape), Shape{0, 5, 1}}, "t").contiguous);
  // 11 dims of size 2 with increasing strides: nothing merges.
  Shape big(11, 2), st(11);
  for (int d = 0; d < 11; ++d) st[d] = int64_t{1} << d;
  CHECK_THROWS_WITH(cuda_ops::make_offset_calc<1>(big, {st}, "op"), Catch::Contains("op") && Catch::Contains("dims"));
}
