// Coverage of the CUDA backend: every op with a CPU kernel has a CUDA kernel, except the ops
// listed in kCpuOnly (documented there). Registration is static, so this test needs no GPU:
// it fails the build's test run as soon as a CPU kernel is added without its CUDA twin (or a
// CUDA kernel disappears), instead of letting the gap grow silently.
#include <algorithm>
#include <iostream>
#include <set>

#include "cuda_test_util.h"
#include "tensor/dispatch.h"

using namespace dtr;

namespace {

/// Ops that intentionally have no CUDA kernel, with the reason. Every op of the foundation runs on
/// CUDA (ops/cuda/*: pointwise, reductions, softmax, norm, rope, embedding, loss, dropout, cat,
/// adamw; copies / casts / fill / GEMM and attention; views are registered for both devices in
/// ops/view.cpp). CPU-only:
///  - cross_entropy_loss_and_grad_: the fused head's one-pass loss + gradient over a chunk's
///    logits; linear_cross_entropy takes it only where a kernel is registered and otherwise (CUDA,
///    DTensor logits) runs cross_entropy + cross_entropy_backward, which have CUDA kernels.
const std::set<std::string> kCpuOnly = {"cross_entropy_loss_and_grad_"};

}  // namespace

TEST_CASE("every CPU op has a CUDA kernel except the documented CPU-only ones", "[cuda]") {
  const std::vector<std::string> cpu = registered_ops(DeviceType::CPU);
  const std::vector<std::string> gpu = registered_ops(DeviceType::CUDA);
  const std::set<std::string> gpu_set(gpu.begin(), gpu.end()), cpu_set(cpu.begin(), cpu.end());
  std::set<std::string> missing;
  for (const std::string& op : cpu)
    if (!gpu_set.count(op)) missing.insert(op);
  std::string listed;
  for (const std::string& op : missing) listed += op + " ";
  std::string cuda_only;
  for (const std::string& op : gpu)
    if (!cpu_set.count(op)) cuda_only += op + " ";
  std::cout << "CUDA coverage: " << gpu.size() << " CUDA kernels for " << cpu.size() << " CPU ops; missing: ["
            << listed << "]; CUDA-only: [" << cuda_only << "]\n";
  INFO("CPU ops without a CUDA kernel: " << listed);
  CHECK(missing == kCpuOnly);
}
