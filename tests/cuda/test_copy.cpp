// CUDA copies against the CPU backend: host<->device round trips for every dtype, strided
// sources and destinations, casts between every pair of dtypes, fill_, copy_ (broadcast and
// across devices), clone / contiguous, slice backward, item(), and autograd through them.
#include "cuda_test_util.h"
#include "tensor/cuda/cuda_context.h"

using namespace dtr;

namespace {

const std::vector<DType> kAll = {DType::f64, DType::f32, DType::bf16, DType::f16,
                                 DType::i64, DType::i32, DType::u8,   DType::bool_};

/// Values exact in every dtype and non-negative (u8): 0, 1, ..., 7, 0, ... plus halves for
/// floating dtypes (i * 0.5 mod 8).
Tensor sample(const Shape& shape, DType dt) {
  const int64_t n = shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = is_floating(dt) ? static_cast<double>(i % 16) * 0.5 : static_cast<double>(i % 8);
  return from_vector<double>(v, shape).to(dt);
}

/// Exact equality of two tensors (values read as double, shapes and dtypes equal).
void require_equal(const Tensor& a, const Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  REQUIRE(a.dtype() == b.dtype());
  CHECK(a.to_vector<double>() == b.to_vector<double>());
}

}  // namespace

TEST_CASE("copy: CPU -> CUDA -> CPU round trip, every dtype", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  for (DType dt : kAll) {
    INFO(dtype_name(dt));
    const Tensor x = sample({3, 7, 5}, dt);
    const Tensor g = x.to(dev);
    CHECK(g.device() == dev);
    CHECK(g.dtype() == dt);
    require_equal(g.to(Device::cpu()), x);
    // empty and 0-d tensors
    require_equal(sample({0, 4}, dt).to(dev).to(Device::cpu()), sample({0, 4}, dt));
    require_equal(sample({}, dt).to(dev).to(Device::cpu()), sample({}, dt));
  }
}

TEST_CASE("copy: strided sources and destinations", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    INFO(dtype_name(dt));
    const Tensor x = sample({4, 6, 5}, dt);
    // non-contiguous CPU source -> CUDA
    const Tensor xp = x.permute({2, 0, 1});
    require_equal(xp.to(dev).to(Device::cpu()), xp.contiguous());
    // non-contiguous CUDA source -> CPU, and contiguous() on the device
    const Tensor g = x.to(dev);
    require_equal(g.permute({2, 0, 1}).to(Device::cpu()), xp.contiguous());
    require_equal(g.permute({1, 2, 0}).contiguous().to(Device::cpu()), x.permute({1, 2, 0}).contiguous());
    require_equal(slice(g, 1, 1, 6, 2).to(Device::cpu()), slice(x, 1, 1, 6, 2).contiguous());
    require_equal(g.narrow(2, 1, 3).transpose(0, 1).clone().to(Device::cpu()),
                  x.narrow(2, 1, 3).transpose(0, 1).contiguous());
    // expanded (stride 0) source
    const Tensor row = sample({1, 5}, dt);
    require_equal(row.to(dev).expand({4, 5}).contiguous().to(Device::cpu()), row.expand({4, 5}).contiguous());
    // strided destination: copy_ into a transposed view
    Tensor dst = zeros({5, 4}, TensorOptions(dt).with_device(dev));
    Tensor dt_view = dst.t();
    dt_view.copy_(sample({4, 5}, dt).to(dev));
    require_equal(dst.to(Device::cpu()), sample({4, 5}, dt).t().contiguous());
  }
}

TEST_CASE("copy: casts between every pair of dtypes equal the CPU's", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  // Values that exercise rounding: thirds and large magnitudes in floating types.
  std::vector<double> v;
  for (int i = 0; i < 97; ++i) v.push_back((i % 11) / 3.0 + (i % 5 == 0 ? 1000.0 / 7.0 : 0.0));
  const Tensor base = from_vector<double>(v, {97});
  for (DType from : kAll) {
    const Tensor x = base.to(from);
    const Tensor g = x.to(dev);
    for (DType to : kAll) {
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      require_equal(g.to(to).to(Device::cpu()), x.to(to));
      // strided cast
      require_equal(slice(g, 0, 3, 97, 3).to(to).to(Device::cpu()), slice(x, 0, 3, 97, 3).to(to));
    }
  }
}

TEST_CASE("copy: fill_, zeros/ones/full_like on CUDA", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  for (DType dt : kAll) {
    INFO(dtype_name(dt));
    Tensor g = zeros({3, 4}, TensorOptions(dt).with_device(dev));
    Tensor c = zeros({3, 4}, TensorOptions(dt));
    Tensor gv = g.narrow(1, 1, 2);
    Tensor cv = c.narrow(1, 1, 2);
    gv.fill_(2.5);
    cv.fill_(2.5);
    require_equal(g.to(Device::cpu()), c);
    const Tensor f = full_like(g, 3.0);
    CHECK(f.device() == dev);
    require_equal(f.to(Device::cpu()), full_like(c, 3.0));
  }
}

TEST_CASE("copy: copy_ broadcasts, casts and crosses devices", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  Tensor dst = zeros({4, 3}, TensorOptions(DType::bf16).with_device(dev));
  dst.copy_(sample({3}, DType::f32).to(dev));  // broadcast + cast on the device
  require_equal(dst.to(Device::cpu()), sample({3}, DType::f32).expand({4, 3}).to(DType::bf16));
  dst.copy_(sample({4, 3}, DType::f64));  // CPU source into a CUDA tensor
  require_equal(dst.to(Device::cpu()), sample({4, 3}, DType::f64).to(DType::bf16));
  Tensor host = zeros({4, 3}, TensorOptions(DType::f32));
  host.copy_(dst);  // CUDA source into a CPU tensor
  require_equal(host, sample({4, 3}, DType::f64).to(DType::bf16).to(DType::f32));
}

TEST_CASE("copy: item(), to_vector and from_vector on CUDA", "[cuda]") {
  DTR_REQUIRE_CUDA();
  const Device dev = testing::cuda_device();
  const Tensor s = from_vector<float>({4.25f}, {}, TensorOptions(DType::f32).with_device(dev));
  CHECK(s.device() == dev);
  CHECK(s.item<float>() == 4.25f);
  CHECK(s.item<int64_t>() == 4);
  CHECK(from_vector<int64_t>({1, 2, 3}, {3}, TensorOptions(DType::i64).with_device(dev)).to_vector<int64_t>() ==
        std::vector<int64_t>{1, 2, 3});
}

TEST_CASE("copy: autograd through clone, casts, to_device and slicing matches the CPU", "[cuda]") {
  DTR_REQUIRE_CUDA();
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    INFO(dtype_name(dt));
    const Tensor x = randn({6, 5}, TensorOptions(dt).with_requires_grad());
    const double atol = testing::atol_for(dt), rtol = testing::rtol_for(dt);
    // One output per check: several outputs would accumulate gradients with add (not a copy op).
    using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
    const std::vector<Fn> fns = {
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].t().contiguous()}; },
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{to_dtype(in[0], DType::f32)}; },
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{slice(in[0], 1, 1, 5, 2)}; },
    };
    for (const Fn& f : fns) testing::check_cuda_matches_cpu(f, {x}, atol, rtol);
  }
  // to_device inside the function: CUDA -> CPU -> CUDA keeps the graph
  const Tensor y = randn({4, 4}, TensorOptions(DType::f32).with_requires_grad());
  testing::check_cuda_matches_cpu(
      [](const std::vector<Tensor>& in) {
        const Device home = in[0].device();
        return std::vector<Tensor>{in[0].to(Device::cpu()).to(DType::f64).to(home)};
      },
      {y}, 0.0, 0.0);
}

TEST_CASE("copy: between two CUDA devices", "[cuda]") {
  DTR_REQUIRE_CUDA();
  if (cuda::device_count() < 2) {
    WARN("one CUDA device: cross-device copy not tested");
    return;
  }
  const Tensor x = sample({5, 6}, DType::f32);
  const Tensor g0 = x.to(Device::cuda(0));
  const Tensor g1 = g0.t().to(Device::cuda(1));
  CHECK(g1.device() == Device::cuda(1));
  require_equal(g1.to(Device::cpu()), x.t().contiguous());
}
