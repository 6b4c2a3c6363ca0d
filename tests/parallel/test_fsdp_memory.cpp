// fully_shard frees each unit's reduce-scatter input as soon as that reduce-scatter is done
// (FSDP2: the previous unit's reduction is finished when the next one is issued), so the live
// bytes during backward hold about two units' unsharded gradients, not every unit's: measured
// with the allocator's peak counter on a stack of equal units (1-d FSDP, bf16 / f32 mixed
// precision, HSDP 2 x 2 at 4 ranks), and the gradients still equal the single-process ones.
#include <cstdio>

#include "gradcheck.h"
#include "parallel_test_util.h"
#include "tensor/allocator.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

/// Width of every unit: divisible by 1-4 ranks, so a unit's reduce-scatter input (padded to
/// ceil(rows / shard) rows per rank) is exactly its parameter's size.
constexpr int64_t kWidth = 240;
constexpr int64_t kRows = 12;  // global batch rows (equal shares on 1-4 ranks)

/// x -> x + Linear_l(x) for l < n: one unit per layer, a root without parameters.
struct Stack : nn::Module {
  std::shared_ptr<nn::ModuleList> layers;
  explicit Stack(int n) {
    layers = register_module("layers", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < n; ++i) layers->push_back(std::make_shared<nn::Linear>(kWidth, kWidth, false));
  }
  std::string type_name() const override { return "Stack"; }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (auto& l : layers->children()) h = add(h, l->call(h));
    return h;
  }
};

std::shared_ptr<Stack> make_stack(int n) {
  manual_seed(77);
  return std::make_shared<Stack>(n);
}

/// Rows [begin, end) of the global input.
Tensor input_rows(int64_t begin, int64_t end) {
  std::vector<float> v;
  for (int64_t r = begin; r < end; ++r)
    for (int64_t c = 0; c < kWidth; ++c) v.push_back(static_cast<float>(((r * 13 + c * 7) % 17) - 8) / 8.0f);
  return from_vector<float>(v, {end - begin, kWidth});
}

Tensor loss_of_stack(Stack& m, const Tensor& x) {
  const Tensor y = m.call(x).to(DType::f32);
  return mean(mul(y, y));
}

struct Measured {
  double peak_above_start = 0;  // bytes: the backward's peak minus the live bytes when it starts
  std::shared_ptr<Stack> net;
};

/// Shards a stack of `n` units over `mesh`, runs a warm-up step, then measures one backward.
Measured measure(int n, const DeviceMesh& mesh, const FSDPOptions& opt) {
  Measured r;
  r.net = make_stack(n);
  for (auto& l : r.net->layers->children()) fully_shard(*l, mesh, opt);
  fully_shard(*r.net, mesh, opt);
  const int64_t share = kRows / world_size();
  const Tensor x = input_rows(rank() * share, (rank() + 1) * share);
  loss_of_stack(*r.net, x).backward();  // warm-up (forward order, allocator caches)
  for (auto& p : r.net->parameters()) p.set_grad(Tensor());
  Tensor loss = loss_of_stack(*r.net, x);
  const int64_t start = memory_stats().current;
  reset_peak_memory();
  loss.backward();
  r.peak_above_start = static_cast<double>(memory_stats().peak - start);
  return r;
}

}  // namespace

TEST_CASE("fully_shard: backward holds about two units' unsharded gradients, not every unit's", "[fsdp][memory]") {
  struct Variant {
    std::string name;
    std::vector<int64_t> shape;  // mesh
    FSDPOptions opt;
  };
  std::vector<Variant> variants = {{"FSDP", {world_size()}, {}}};
  FSDPOptions mp;
  mp.mp_policy.param_dtype = DType::bf16;
  mp.mp_policy.reduce_dtype = DType::f32;
  variants.push_back({"bf16 params, f32 reduce", {world_size()}, mp});
  if (world_size() == 4) variants.push_back({"HSDP 2 x 2", {2, 2}, {}});
  const auto ref = make_stack(16);
  loss_of_stack(*ref, input_rows(0, kRows)).backward();
  for (const Variant& v : variants) {
    INFO(v.name << " on " << world_size() << " ranks");
    const DeviceMesh mesh = v.shape.size() == 1 ? DeviceMesh(v.shape, {"dp_shard"})
                                                : DeviceMesh(v.shape, {"dp_replicate", "dp_shard"});
    const double shard = static_cast<double>(v.shape.back());
    // One unit's unsharded gradient (= its reduce-scatter input) in reduce_dtype, its parameter
    // in param_dtype.
    const double G = static_cast<double>(kWidth * kWidth) * 4.0;
    const double P = static_cast<double>(kWidth * kWidth) * (v.opt.mp_policy.param_dtype ? 2.0 : 4.0);
    const Measured few = measure(4, mesh, v.opt), many = measure(16, mesh, v.opt);
    // Twelve more units add their sharded gradients (f32, G / shard each) and nothing else: the
    // unsharded gradients of a finished unit are freed when the next unit's reduce-scatter is
    // issued (before: every one stayed until the end of backward, 12 G more).
    const double growth = many.peak_above_start - few.peak_above_start;
    if (rank() == 0)
      std::printf("[%d ranks] %s: backward peak above its start, in units' reduce-scatter inputs G = %.0f bytes: "
                  "4 units %.2f G, 16 units %.2f G\n",
                  world_size(), v.name.c_str(), G, few.peak_above_start / G, many.peak_above_start / G);
    INFO("peak above start: 4 units " << few.peak_above_start / G << " G, 16 units " << many.peak_above_start / G
                                      << " G (G = " << G << " bytes)");
    CHECK(growth <= 12.0 * G / shard + 0.5 * G);
    // The peak: the gathered current and prefetched units with an all-gather output each (4 P),
    // the current unit's gradient in the param dtype (P), its reduce_dtype copy and chunk_cat input
    // (2 G), the previous unit's reduce-scatter input (G), the sharded gradients, 0.5 G slack
    // (activation gradients, reduce-scatter outputs).
    CHECK(many.peak_above_start <= 5.0 * P + 3.5 * G + 16.0 * G / shard);
    if (v.opt.mp_policy.param_dtype) continue;
    // The reductions still give the single-process gradients.
    auto got = many.net->named_parameters(), want = ref->named_parameters();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO(got[i].first);
      REQUIRE(got[i].second.grad().defined());
      const Tensor w = want[i].second.grad();
      CHECK(max_abs_diff(full_tensor(got[i].second.grad()), w) <= 1e-6 * amax(abs(w)).item<double>() + 1e-9);
    }
  }
}
