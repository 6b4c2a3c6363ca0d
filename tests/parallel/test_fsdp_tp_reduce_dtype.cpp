// FSDP + TP mixed precision: the gradient of a parameter replicated over tp and used on
// sequence-sharded activations (a sequence-parallel norm weight) arrives Partial over tp; its tp
// reduction must run in MixedPrecisionPolicy.reduce_dtype (f32 here), not in param_dtype (bf16),
// like the dp reduce-scatter. Checked by the tp group's all_reduce bytes and by a value whose
// bf16 sum differs from the f32 sum: tp rank 0 contributes 1, every other tp rank 2^-9 (both
// exact in bf16); the f32 sum 1 + (tp - 1) 2^-9 is not a bf16 number. With gradient
// accumulation the Partial gradients are summed in f32 and reduced once, at the sync. Meshes
// (dp_shard, tp): 1x2, 1x3, 2x2, 1x4 (1 rank: nothing to reduce).
#include "parallel_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {

constexpr int64_t kH = 4;  // weight rows: split over dp 2 as 2 + 2

/// y = x * weight (weight [kH], like a norm's scale).
struct Scale : nn::Module {
  Scale() { register_parameter("weight", ones({kH})); }
  std::string type_name() const override { return "Scale"; }
  Tensor forward(const Tensor& x) override { return mul(x, get_parameter("weight")); }
};

struct Net : nn::Module {
  Net() { register_module("norm", std::make_shared<Scale>()); }
  std::string type_name() const override { return "Net"; }
  Tensor forward(const Tensor& x) override { return get_submodule("norm")->call(x); }
};

}  // namespace

TEST_CASE("FSDP + TP: Partial gradients of replicated parameters are reduced over tp in reduce_dtype",
          "[fsdp][tp][mixed_precision]") {
  const int64_t w = world_size();
  std::vector<std::pair<int64_t, int64_t>> meshes;  // (dp_shard, tp)
  if (w == 2) meshes = {{1, 2}};
  if (w == 3) meshes = {{1, 3}};
  if (w == 4) meshes = {{2, 2}, {1, 4}};
  for (auto [dp, tp] : meshes)
    for (int micro : {1, 2}) {
      INFO("mesh " << dp << "x" << tp << " micro-steps " << micro);
      DeviceMesh mesh({dp, tp}, {"dp_shard", "tp"});
      auto m = std::make_shared<Net>();
      parallelize_module(*m, mesh["tp"], {{"norm", std::make_shared<SequenceParallel>(1, false)}});
      FSDPOptions opt;
      opt.mp_policy.param_dtype = DType::bf16;
      opt.mp_policy.reduce_dtype = DType::f32;
      fully_shard(*m, mesh, opt);
      const int64_t t = mesh.coordinate(1);
      const double part = t == 0 ? 1.0 : std::ldexp(1.0, -9);
      Tensor x = full({1, 1, kH}, part);  // this rank's token of the sequence [1, tp, kH]
      CommCounters& tp_cnt = mesh["tp"].group(0)->counters();
      tp_cnt.reset();
      for (int k = 0; k < micro; ++k) {  // gradient accumulation: sync on the last micro-step only
        set_requires_gradient_sync(*m, k + 1 == micro);
        sum(to_local(m->call(x))).backward();
      }
      // One all_reduce over tp per sync, of the kH f32 gradient elements (bf16: 2 bytes each).
      CHECK(tp_cnt.count(CommKind::all_reduce) == 1);
      CHECK(tp_cnt.nbytes(CommKind::all_reduce) == kH * 4);
      const Tensor g = m->get_parameter("norm.weight").grad();
      REQUIRE(g.defined());
      CHECK(g.dtype() == DType::f32);
      const double want = micro * (1.0 + static_cast<double>(tp - 1) * std::ldexp(1.0, -9));  // exact in f32
      for (float v : local_tensor(g).to_vector<float>()) CHECK(static_cast<double>(v) == want);
    }
}
