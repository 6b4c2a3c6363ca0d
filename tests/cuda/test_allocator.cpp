// CUDA caching allocator and pinned host memory: size classes, stream-ordered reuse,
// record_stream, counters, empty_cache, out-of-memory and no-device errors.
#include <atomic>
#include <chrono>

#include "cuda_test_util.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/pinned_allocator.h"

using namespace dtr;
using Catch::Matchers::Contains;

namespace {
TensorOptions on_cuda(DType dt = DType::f32) { return TensorOptions(dt).with_device(testing::cuda_device()); }
}  // namespace

TEST_CASE("caching allocator: size classes", "[cuda]") {
  CHECK(cuda::round_size(1) == 512);
  CHECK(cuda::round_size(512) == 512);
  CHECK(cuda::round_size(513) == 1024);
  CHECK(cuda::round_size(size_t{1} << 20) == (size_t{1} << 20));
  CHECK(cuda::round_size((size_t{1} << 20) + 1) == (size_t{2} << 20));
  CHECK(cuda::round_size(size_t{3} << 20) == (size_t{4} << 20));
}

TEST_CASE("caching allocator: installed for CUDA; clear error without a device", "[cuda]") {
  CHECK(get_allocator(Device::cuda(0)) == cuda::caching_allocator());
  if (testing::cuda_available()) return;
  CHECK_THROWS_WITH(empty({4}, TensorOptions().with_device(Device::cuda(0))), Contains("no CUDA device"));
  CHECK_THROWS_WITH(cuda::empty_pinned({4}, DType::f32), Contains("no CUDA device"));
}

TEST_CASE("caching allocator: a freed block is reused on its stream; counters", "[cuda]") {
  DTR_REQUIRE_CUDA();
  cuda::empty_cache();
  const MemoryStats m0 = memory_stats(Device::cuda());
  const auto s0 = cuda::caching_allocator_stats();
  void* first = nullptr;
  {
    Tensor a = empty({1000}, on_cuda());
    first = a.data_ptr();
    const MemoryStats m1 = memory_stats(Device::cuda());
    CHECK(m1.current == m0.current + 4000);
    CHECK(m1.peak >= m0.current + 4000);
    CHECK(cuda::caching_allocator_stats().allocated == s0.allocated + 4096);  // 512-byte class
  }
  CHECK(memory_stats(Device::cuda()).current == m0.current);
  const auto s1 = cuda::caching_allocator_stats();
  CHECK(s1.cached >= 4096);
  Tensor b = empty({1010}, on_cuda());  // 4040 bytes: the same 4096-byte class
  CHECK(b.data_ptr() == first);
  const auto s2 = cuda::caching_allocator_stats();
  CHECK(s2.num_cache_hits == s1.num_cache_hits + 1);
  CHECK(s2.num_device_allocs == s1.num_device_allocs);
  CHECK(s2.cached == s1.cached - 4096);

  // Large pool: a 3 MiB request is a 4 MiB block.
  {
    Tensor big = empty({3 << 20}, on_cuda(DType::u8));
    CHECK(cuda::caching_allocator_stats().allocated == s2.allocated + (4 << 20));
  }
  cuda::empty_cache();
  const auto s3 = cuda::caching_allocator_stats();
  CHECK(s3.cached == 0);
  CHECK(s3.reserved == s3.allocated);  // only live blocks remain (b)
  CHECK(b.numel() == 1010);
}

TEST_CASE("caching allocator: record_stream defers reuse until the other stream's work is done", "[cuda]") {
  DTR_REQUIRE_CUDA();
  cudaStream_t side;
  DTR_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  // Two cached blocks of one size class, so that no cudaMalloc (which might wait for the
  // blocked side stream) runs below.
  {
    Tensor x1 = empty({4096}, on_cuda());
    Tensor x2 = empty({4096}, on_cuda());
  }
  // Block the side stream with a host function that waits for `release` (at most 20 s).
  static std::atomic<bool> release{false};
  release = false;
  DTR_CUDA_CHECK(cudaLaunchHostFunc(
      side,
      [](void*) {
        const auto t0 = std::chrono::steady_clock::now();
        while (!release.load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
        }
      },
      nullptr));
  void* p = nullptr;
  {
    Tensor a = empty({4096}, on_cuda());
    p = a.data_ptr();
    cuda::record_stream(a.storage()->data(), side);
  }
  {
    Tensor b = empty({4096}, on_cuda());
    CHECK(b.data_ptr() != p);  // a's block still waits for the side stream
  }
  release = true;
  DTR_CUDA_CHECK(cudaStreamSynchronize(side));
  Tensor c = empty({4096}, on_cuda());
  CHECK(c.data_ptr() == p);
  CHECK_THROWS_WITH(cuda::record_stream(reinterpret_cast<char*>(p) + 4, side), Contains("not the start of a live"));
  DTR_CUDA_CHECK(cudaStreamDestroy(side));
}

TEST_CASE("caching allocator: out of memory names the sizes", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const int64_t huge = int64_t{1} << 50;  // 1 PiB
  CHECK_THROWS_WITH(empty({huge}, on_cuda(DType::u8)),
                    Contains("CUDA out of memory") && Contains("tried to allocate 1125899906842624 bytes") &&
                        Contains("cached"));
  Tensor ok = empty({16}, on_cuda());  // still usable afterwards
  CHECK(ok.numel() == 16);
}

TEST_CASE("pinned memory: round trip through a pinned buffer, reuse", "[cuda]") {
  DTR_REQUIRE_CUDA();
  Tensor h = cuda::empty_pinned({64}, DType::f32);
  CHECK(h.device().is_cpu());
  CHECK(cuda::is_pinned(h.data_ptr()));
  float* p = h.data<float>();
  for (int i = 0; i < 64; ++i) p[i] = static_cast<float>(i) * 0.5f;
  Tensor d = h.to(testing::cuda_device());
  Tensor back = d.to(Device::cpu());
  CHECK(back.to_vector<float>() == h.to_vector<float>());
  void* first = h.data_ptr();
  h = Tensor();
  cuda::synchronize();
  Tensor h2 = cuda::empty_pinned({60}, DType::f32);  // same 4 KiB class, its copy has finished
  CHECK(h2.data_ptr() == first);
  CHECK(cuda::pinned_stats().allocated >= 4096);
}
