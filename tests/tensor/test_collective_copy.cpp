// chunk_cat / split_with_sizes_copy (FSDP's reduce-scatter copy-in and all-gather copy-out) and
// UnsafePreserveVersionCounter: values against a reference built from narrow + cat + padding
// (torch._chunk_cat / torch.split_with_sizes_copy semantics), uneven and empty chunks, strided
// outputs, every dtype, errors.
#include <catch2/catch.hpp>

#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/version_guard.h"
#include "tensor/ops.h"
#include "tensor/ops/collective_copy.h"

using namespace dtr;

namespace {

/// The reference: chunk c of x (torch.chunk rows of ceil(rows / k)), flattened, zero padded.
Tensor padded_chunk(const Tensor& x, int64_t k, int64_t c) {
  const int64_t rows = x.size(0), cr = (rows + k - 1) / k;
  const int64_t row_numel = rows == 0 ? 1 : x.numel() / rows;
  const int64_t start = std::min(rows, c * cr), n = std::min(cr, rows - start);
  return cat({x.narrow(0, start, n).reshape({-1}), zeros({(cr - n) * row_numel}, TensorOptions(x.dtype()))}, 0);
}

}  // namespace

TEST_CASE("chunk_cat lays out every tensor's padded chunks row by row", "[collective_copy]") {
  // rows 5, 3, 1, 0 over 4 chunks: uneven, a single row (three empty chunks), an empty tensor.
  const std::vector<Tensor> xs = {arange(0, 10, 1, TensorOptions(DType::f32)).view({5, 2}),
                                  arange(100, 109, 1, TensorOptions(DType::f32)).view({3, 3}),
                                  arange(200, 201, 1, TensorOptions(DType::f32)).view({1}),
                                  zeros({0, 4}, TensorOptions(DType::f32))};
  for (int64_t k : {1, 2, 3, 4, 7}) {
    const Tensor out = chunk_cat(xs, k);
    std::vector<Tensor> rows;
    for (int64_t c = 0; c < k; ++c) {
      std::vector<Tensor> parts;
      for (const Tensor& x : xs) parts.push_back(padded_chunk(x, k, c));
      rows.push_back(cat(parts, 0).view({1, -1}));
    }
    const Tensor ref = cat(rows, 0);
    INFO("num_chunks " << k);
    REQUIRE(out.sizes() == ref.sizes());
    CHECK(out.to_vector<float>() == ref.to_vector<float>());
  }
}

TEST_CASE("chunk_cat takes strided inputs and keeps the dtype", "[collective_copy]") {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i64}) {
    const Tensor x = arange(0, 12, 1, TensorOptions(dt)).view({3, 4}).t();  // [4, 3], strided
    const Tensor out = chunk_cat({x}, 3);                                   // chunks of 2 rows: 2, 2, 0
    REQUIRE(out.dtype() == dt);
    REQUIRE(out.sizes() == Shape{3, 6});
    CHECK(out.to(DType::f64).to_vector<double>() ==
          std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, 0, 0, 0, 0, 0, 0});
  }
}

TEST_CASE("split_with_sizes_copy writes column blocks into strided outputs", "[collective_copy]") {
  const Tensor src = arange(0, 12, 1, TensorOptions(DType::f32)).view({2, 6});
  Tensor buf = zeros({2, 8}, TensorOptions(DType::f32));
  // outputs: a strided view [2, 2] of buf's first columns, an empty piece, a contiguous [2, 4].
  Tensor a = buf.narrow(1, 0, 2), e = zeros({2, 0}, TensorOptions(DType::f32)), b = zeros({2, 4}, TensorOptions(DType::f32));
  const uint32_t va = a.version();
  split_with_sizes_copy(src, {2, 0, 4}, 1, {a, e, b});
  CHECK(buf.to_vector<float>() == std::vector<float>{0, 1, 0, 0, 0, 0, 0, 0, 6, 7, 0, 0, 0, 0, 0, 0});
  CHECK(b.to_vector<float>() == std::vector<float>{2, 3, 4, 5, 8, 9, 10, 11});
  CHECK(a.version() == va + 1);  // an in-place write
  CHECK(buf.version() == va + 1);
  CHECK_THROWS_WITH(split_with_sizes_copy(src, {2, 3}, 1, {a, b}), Catch::Contains("output 1") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(split_with_sizes_copy(src, {2, 3}, 1, {a}), Catch::Contains("2 split sizes for 1"));
  CHECK_THROWS_WITH(split_with_sizes_copy(src, {2, 3, 1}, 1, {a, b, e}), Catch::Contains("output 1"));
  CHECK_THROWS_WITH(split_with_sizes_copy(src, {2, 2, 1}, 1, {a, zeros({2, 2}), zeros({2, 1})}),
                    Catch::Contains("sum to 5"));
}

TEST_CASE("chunk_cat errors name the problem", "[collective_copy]") {
  const Tensor x = zeros({2, 2});
  CHECK_THROWS_WITH(chunk_cat({}, 2), Catch::Contains("non-empty"));
  CHECK_THROWS_WITH(chunk_cat({x}, 0), Catch::Contains("num_chunks=0"));
  CHECK_THROWS_WITH(chunk_cat({x, zeros({}, TensorOptions(DType::f32))}, 2), Catch::Contains("zero-dimensional"));
  CHECK_THROWS_WITH(chunk_cat({x, zeros({2}, TensorOptions(DType::f64))}, 2), Catch::Contains("tensor 1 is float64"));
  Tensor w = zeros({2, 2}).set_requires_grad(true);
  CHECK_THROWS_WITH(chunk_cat({w}, 2), Catch::Contains("not differentiable"));
  NoGradGuard no_grad;
  CHECK(chunk_cat({w}, 2).sizes() == Shape{2, 2});
}

TEST_CASE("UnsafePreserveVersionCounter restores the counters of the tensors and their views", "[collective_copy]") {
  Tensor t = zeros({4});
  Tensor v = t.narrow(0, 1, 2);
  const uint32_t before = t.version();
  {
    UnsafePreserveVersionCounter keep({v});
    v.fill_(1.0);
    t.fill_(2.0);
    CHECK(t.version() == before + 2);
  }
  CHECK(t.version() == before);
  CHECK(v.version() == before);
  CHECK(t.to_vector<float>() == std::vector<float>{2, 2, 2, 2});
}
