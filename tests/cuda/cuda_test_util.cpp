#include "cuda_test_util.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "tensor/autograd/node.h"
#include "tensor/random.h"
#ifdef DTR_WITH_CUDA
#include "tensor/cuda/cuda_context.h"
#endif

namespace dtr::testing {

bool cuda_available() {
#ifdef DTR_WITH_CUDA
  if (cuda::device_count() <= 0) return false;
  // The kernels are built for sm_90 + compute_90 PTX (CMakeLists.txt): an older GPU has no
  // kernel image, so the tests skip there (build with -DCMAKE_CUDA_ARCHITECTURES=native to run).
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cuda::current_device()) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major >= 9;
#else
  return false;
#endif
}

bool cuda_required() {
  const char* v = std::getenv("DTR_TEST_REQUIRE_CUDA");
  return v && std::string(v) == "1";
}

Device cuda_device() {
#ifdef DTR_WITH_CUDA
  return Device::cuda(cuda::current_device());
#else
  DTR_ERROR("cuda_device: dtr was built without the CUDA backend");
#endif
}

double atol_for(DType dt) {
  switch (dt) {
    case DType::f64: return 1e-10;
    case DType::f32: return 1e-5;
    case DType::bf16: return 1e-2;
    case DType::f16: return 1e-3;
    default: return 0.0;
  }
}

double rtol_for(DType dt) { return atol_for(dt); }

std::string compare_with_cpu(const Tensor& a, const Tensor& ref, double atol, double rtol, const std::string& what) {
  std::ostringstream os;
  if (a.sizes() != ref.sizes() || a.dtype() != ref.dtype()) {
    os << what << ": shape/dtype " << a.sizes() << " " << a.dtype() << " vs CPU " << ref.sizes() << " " << ref.dtype();
    return os.str();
  }
  const std::vector<double> va = a.to_vector<double>();
  const std::vector<double> vr = ref.to_vector<double>();
  double max_diff = 0.0;
  int64_t first_bad = -1;
  for (size_t i = 0; i < va.size(); ++i) {
    const bool both_nan = std::isnan(va[i]) && std::isnan(vr[i]);
    const bool same_inf = std::isinf(va[i]) && va[i] == vr[i];
    if (both_nan || same_inf) continue;
    const double d = std::fabs(va[i] - vr[i]);
    if (!(d <= max_diff)) max_diff = d;  // NaN-safe
    if (!(d <= atol + rtol * std::fabs(vr[i])) && first_bad < 0) first_bad = static_cast<int64_t>(i);
  }
  if (first_bad < 0) return "";
  os << what << ": element " << first_bad << " (row-major) is " << va[first_bad] << " on CUDA vs " << vr[first_bad]
     << " on CPU; max |diff| " << max_diff << " (atol " << atol << ", rtol " << rtol << ", shape " << ref.sizes()
     << ", " << ref.dtype() << ")";
  return os.str();
}

namespace {

/// Fresh leaves holding the data of `xs` on `d` with the same requires_grad.
std::vector<Tensor> leaves_on(const std::vector<Tensor>& xs, Device d) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) {
    if (!x.defined()) {
      out.emplace_back();
      continue;
    }
    Tensor y = x.detach().to(d);
    if (y.is_same(x) || y.storage() == x.storage()) y = y.clone();  // never share data with the caller
    y = y.detach();
    if (x.requires_grad()) y.set_requires_grad(true);
    out.push_back(y);
  }
  return out;
}

/// Fixed weights in [-1, 1) for output `k` (Philox, independent of the global generator).
Tensor weights_like(const Tensor& out, int k) {
  std::vector<float> w(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 2.0f * philox_uniform(0x5eed0000u + k, i) - 1.0f;
  return from_vector(w, out.sizes()).to(out.dtype());
}

}  // namespace

void check_cuda_matches_cpu(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& f,
                            const std::vector<Tensor>& cpu_inputs, double atol, double rtol, bool check_backward) {
  const Device dev = cuda_device();
  std::vector<Tensor> in_cpu = leaves_on(cpu_inputs, Device::cpu());
  std::vector<Tensor> in_gpu = leaves_on(cpu_inputs, dev);

  const GeneratorState rng = generator_state();
  std::vector<Tensor> out_cpu, out_gpu;
  {
    GeneratorStateGuard g(rng);
    out_cpu = f(in_cpu);
  }
  {
    GeneratorStateGuard g(rng);
    out_gpu = f(in_gpu);
  }
  REQUIRE(out_cpu.size() == out_gpu.size());
  for (size_t i = 0; i < out_cpu.size(); ++i) {
    INFO("output " << i);
    REQUIRE(out_cpu[i].defined() == out_gpu[i].defined());
    if (!out_cpu[i].defined()) continue;
    REQUIRE(out_gpu[i].device() == dev);
    const std::string msg = compare_with_cpu(out_gpu[i], out_cpu[i], atol, rtol, "output " + std::to_string(i));
    CHECK(msg == "");
  }
  if (!check_backward) return;

  std::vector<Tensor> roots_cpu, grads_cpu, roots_gpu, grads_gpu;
  for (size_t i = 0; i < out_cpu.size(); ++i) {
    if (!out_cpu[i].defined() || !is_floating(out_cpu[i].dtype()) || !out_cpu[i].requires_grad()) continue;
    REQUIRE(out_gpu[i].requires_grad());
    const Tensor w = weights_like(out_cpu[i], static_cast<int>(i));
    roots_cpu.push_back(out_cpu[i]);
    grads_cpu.push_back(w);
    roots_gpu.push_back(out_gpu[i]);
    grads_gpu.push_back(w.to(dev));
  }
  if (roots_cpu.empty()) return;
  run_backward(roots_cpu, grads_cpu, false);
  run_backward(roots_gpu, grads_gpu, false);
  for (size_t j = 0; j < in_cpu.size(); ++j) {
    if (!in_cpu[j].defined() || !in_cpu[j].requires_grad()) continue;
    INFO("gradient of input " << j);
    const Tensor gc = in_cpu[j].grad(), gg = in_gpu[j].grad();
    REQUIRE(gc.defined() == gg.defined());
    if (!gc.defined()) continue;
    REQUIRE(gg.device() == dev);
    const std::string msg = compare_with_cpu(gg, gc, atol, rtol, "grad of input " + std::to_string(j));
    CHECK(msg == "");
  }
}

}  // namespace dtr::testing
