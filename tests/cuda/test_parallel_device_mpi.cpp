// The parallel layer on CUDA tensors (2 ranks): fully_shard, replicate, the TP styles and loss
// parallel on a CUDA mesh give the results of the same code on a CPU mesh (losses of 3 AdamW
// steps and the full parameters; loss-parallel loss and logits gradient). The device runs skip
// without a GPU (fail under DTR_TEST_REQUIRE_CUDA=1); the "device path on CPU" case runs the
// same harness with a CPU "device", so the comparison itself is exercised on every build.
#include "cuda_test_util.h"
#include "parallel/ddp.h"
#include "parallel/parallel_test_util.h"
#include "tensor/nn/to_device.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

/// f32 on another backend: the kernels sum in other orders (GEMM tiles, block reductions), ~1e-7
/// relative per op; after 3 AdamW steps at lr 1e-2 the parameters move ~3e-2, and a wrong
/// collective would differ by that much. 2e-5 leaves room for the sum orders (CUDA kernel
/// tolerance of f32 is 1e-5 per op, cuda_test_util.h).
constexpr double kTol = 2e-5;

enum class Strategy { fsdp, ddp, tp };

/// 3 AdamW steps of TinyNet on `dev` under `strategy` over the world (TP: the tiny plan,
/// every rank the whole batch; FSDP / DDP: each rank its rows). Data in, losses out.
RunResult run_on(Device dev, Strategy strategy) {
  auto net = make_net();
  nn::module_to_device(*net, dev);
  const DeviceMesh mesh({world_size()}, {"dp"}, dev);
  if (strategy == Strategy::fsdp) {
    for (auto& l : net->layers->children()) fully_shard(*l, mesh);
    fully_shard(*net, mesh);
  } else if (strategy == Strategy::ddp) {
    replicate(*net, mesh);
  } else {
    parallelize_module(*net, mesh, tiny_tp_plan());
  }
  std::vector<Tensor> ps;
  for (auto& p : net->parameters())
    if (p.requires_grad()) ps.push_back(p);
  optim::AdamW adam(ps, optim::AdamWOptions{1e-2});
  const bool tp = strategy == Strategy::tp;
  const int64_t rows = tp ? kBatch : kBatch / world_size(), begin = tp ? 0 : rank() * rows;
  RunResult r;
  for (int step = 0; step < 3; ++step) {
    auto [ids, tg] = batch_rows(step, begin, begin + rows);
    Tensor loss = loss_of(*net, ids.to(dev), tg.to(dev));
    loss.backward();
    adam.step();
    adam.zero_grad();
    Tensor l = (loss.is_distributed() ? full_tensor(loss.detach()) : loss.detach()).to(DType::f64).to(Device::cpu()).view({1});
    if (!tp) mesh.group(0)->all_reduce(l, ReduceOp::AVG)->wait();
    r.losses.push_back(l.item<double>());
  }
  for (auto& [n, t] : full_params(*net)) r.params[n] = t.to(Device::cpu());
  return r;
}

void check_same(const RunResult& dev, const RunResult& cpu) {
  REQUIRE(dev.losses.size() == cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) CHECK(std::abs(dev.losses[i] - cpu.losses[i]) <= kTol);
  const auto [d, where] = max_param_diff(dev.params, cpu.params);
  INFO("max |param diff| " << d << " at " << where);
  CHECK(d <= kTol);
}

/// Loss parallel: logits [N, C] Shard(1) on a mesh of `dev`; the loss and the logits gradient
/// (full, on the CPU). N = 7 rows, C = 11 classes: uneven class shards; targets with ignored rows.
std::pair<double, Tensor> loss_parallel_on(Device dev) {
  manual_seed(7);
  Tensor logits = randn({7, kVocab}, TensorOptions(DType::f32));
  const Tensor tg = from_vector<int64_t>({3, -100, 10, 0, 5, -100, 9}, {7});
  const DeviceMesh mesh({world_size()}, {"tp"}, dev);
  Tensor d = distribute_tensor(logits.to(dev), mesh, {Shard(1)}).set_requires_grad(true);
  Tensor loss = cross_entropy(d, tg.to(dev));
  loss.backward();
  return {full_tensor(loss.detach()).to(Device::cpu()).item<double>(), full_tensor(d.grad()).to(Device::cpu())};
}

void check_all_on(Device dev) {
  for (Strategy s : {Strategy::fsdp, Strategy::ddp, Strategy::tp}) {
    INFO("strategy " << static_cast<int>(s) << " on " << dev);
    check_same(run_on(dev, s), run_on(Device::cpu(), s));
  }
  // loss parallel against the single-process cross_entropy on the CPU
  manual_seed(7);
  Tensor logits = randn({7, kVocab}, TensorOptions(DType::f32)).set_requires_grad(true);
  Tensor ref = cross_entropy(logits, from_vector<int64_t>({3, -100, 10, 0, 5, -100, 9}, {7}));
  ref.backward();
  const auto [loss, grad] = loss_parallel_on(dev);
  CHECK(std::abs(loss - ref.item<double>()) <= kTol);
  CHECK(compare_with_cpu(grad, logits.grad(), kTol, kTol, "loss-parallel logits gradient") == "");
}

}  // namespace

TEST_CASE("parallel layer on CUDA tensors equals the CPU: fully_shard, replicate, TP styles, loss parallel",
          "[cuda][mpi]") {
  DTR_REQUIRE_CUDA();
  check_all_on(testing::cuda_device());
}

TEST_CASE("parallel layer device path on CPU (the harness of the CUDA case)", "[mpi]") {
  check_all_on(Device::cpu());
}
