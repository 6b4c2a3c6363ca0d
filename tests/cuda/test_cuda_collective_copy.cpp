// CUDA kernels of the collective copy ops (chunk_cat, split_with_sizes_copy) and of arange /
// full on the device, against the CPU kernels: bit-equal (pure data movement and exact fills).
#include "cuda_test_util.h"
#include "tensor/ops/collective_copy.h"

using namespace dtr;
using namespace dtr::testing;

TEST_CASE("chunk_cat on CUDA equals the CPU (uneven, empty chunks, strided, every dtype)", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i64}) {
    const std::vector<Tensor> cpu = {arange(0, 10, 1, TensorOptions(dt)).view({5, 2}),
                                     arange(0, 12, 1, TensorOptions(dt)).view({3, 4}).t(),
                                     arange(3, 4, 1, TensorOptions(dt)).view({1})};
    std::vector<Tensor> gpu;
    for (const Tensor& t : cpu) gpu.push_back(t.to(dev));
    for (int64_t k : {1, 3, 4}) {
      const Tensor out = chunk_cat(gpu, k);
      CHECK(out.device() == dev);
      CHECK(compare_with_cpu(out, chunk_cat(cpu, k), 0, 0, "chunk_cat") == "");
    }
  }
}

TEST_CASE("split_with_sizes_copy on CUDA equals the CPU (strided outputs)", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  const Tensor src = arange(0, 24, 1, TensorOptions(DType::bf16)).view({3, 8});
  Tensor cb = zeros({3, 10}, TensorOptions(DType::bf16)), gb = cb.to(dev);
  std::vector<Tensor> co = {cb.narrow(1, 0, 3), zeros({3, 0}, TensorOptions(DType::bf16)), zeros({3, 5}, TensorOptions(DType::bf16))};
  std::vector<Tensor> go = {gb.narrow(1, 0, 3), co[1].to(dev), co[2].to(dev)};
  split_with_sizes_copy(src, {3, 0, 5}, 1, co);
  split_with_sizes_copy(src.to(dev), {3, 0, 5}, 1, go);
  CHECK(compare_with_cpu(gb, cb, 0, 0, "padded buffer") == "");
  CHECK(compare_with_cpu(go[2], co[2], 0, 0, "contiguous output") == "");
}

TEST_CASE("arange and full are made on the device and equal the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64, DType::i32}) {
    CHECK(compare_with_cpu(arange(-3, 17, 0.5, TensorOptions(dt).with_device(dev)), arange(-3, 17, 0.5, TensorOptions(dt)),
                           0, 0, "arange") == "");
    CHECK(compare_with_cpu(full({4, 3}, 1.25, TensorOptions(dt).with_device(dev)), full({4, 3}, 1.25, TensorOptions(dt)), 0,
                           0, "full") == "");
  }
}
