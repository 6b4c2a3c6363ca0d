// clip_grad_norm: the global norm of plain and DTensor gradients (FSDP shards, HSDP, 2-d
// meshes, several meshes at once) equals the single-process norm; clipping scales in place.
#include "parallel/clip_grad.h"
#include "parallel_test_util.h"

using namespace dtr;
using namespace dtr::testing;

namespace {
/// f64 sums of squares of f32 gradients: only the order of the partial sums differs.
constexpr double kNormTol = 1e-6;
}  // namespace

TEST_CASE("clip_grad_norm: FSDP gradients give the single-process norm and clipped gradients") {
  DeviceMesh mesh = DeviceMesh::world("dp");
  auto ref = make_net();
  {
    auto [ids, tg] = batch_rows(0, 0, kBatch);
    loss_of(*ref, ids, tg).backward();
  }
  auto net = make_net();
  for (auto& l : net->layers->children()) fully_shard(*l, mesh);
  fully_shard(*net, mesh);
  {
    const int64_t rows = kBatch / world_size();
    auto [ids, tg] = batch_rows(0, rank() * rows, (rank() + 1) * rows);
    loss_of(*net, ids, tg).backward();
  }
  const double ref_norm = clip_grad_norm(ref->parameters(), 0.1);
  const double norm = clip_grad_norm(net->parameters(), 0.1);
  INFO("single " << ref_norm << " fsdp " << norm);
  CHECK(std::abs(norm - ref_norm) <= kNormTol * ref_norm);
  REQUIRE(ref_norm > 0.1);  // clipping happened
  for (auto& [fqn, p] : net->named_parameters()) {
    const Tensor g = full_tensor(p.grad());
    CHECK(amax(abs(sub(g, ref->get_parameter(fqn).grad()))).item<double>() <= 1e-6);
  }
  // After clipping the norm is max_norm.
  CHECK(std::abs(clip_grad_norm(net->parameters(), 1e9) - 0.1) <= 1e-5);
  // inf norm
  CHECK(std::abs(clip_grad_norm(net->parameters(), 1e9, INFINITY) - clip_grad_norm(ref->parameters(), 1e9, INFINITY)) <=
        1e-6);
}

TEST_CASE("clip_grad_norm: gradients on several meshes and placements") {
  const int w = world_size();
  manual_seed(7);
  const Tensor a = normal({9, 6}, 0, 1), b = normal({5, 3}, 0, 1), c = normal({4}, 0, 1), d = normal({7, 5}, 0, 1);
  auto param_with_grad = [](const Tensor& g) {
    Tensor p = zeros_like(g).set_requires_grad(true);
    p.set_grad(g.clone());
    return p;
  };
  std::vector<Tensor> plain{param_with_grad(a), param_with_grad(b), param_with_grad(c), param_with_grad(d)};
  DeviceMesh m1 = DeviceMesh::world("x");
  std::vector<Tensor> dist;
  auto dparam = [](const Tensor& g, const DeviceMesh& m, const Placements& pl) {
    Tensor dg = distribute_tensor(g, m, pl, std::nullopt);
    Tensor p = distribute_tensor(zeros_like(g), m, pl, std::nullopt).set_requires_grad(true);
    p.set_grad(dg);
    return p;
  };
  dist.push_back(dparam(a, m1, {Shard(0)}));
  dist.push_back(dparam(b, m1, {Replicate()}));
  dist.push_back(param_with_grad(c));  // plain
  if (w == 4) {
    DeviceMesh m2({2, 2}, {"r", "s"});
    dist.push_back(dparam(d, m2, {Shard(0), Shard(1)}));
  } else {
    dist.push_back(dparam(d, m1, {Shard(1)}));
  }
  const double ref = clip_grad_norm(plain, 1.0);
  const double got = clip_grad_norm(dist, 1.0);
  CHECK(std::abs(got - ref) <= kNormTol * ref);
  for (size_t i = 0; i < dist.size(); ++i) {
    const Tensor g = dist[i].grad().is_distributed() ? full_tensor(dist[i].grad()) : dist[i].grad();
    CHECK(amax(abs(sub(g, plain[i].grad()))).item<double>() <= 1e-6);
  }
  CHECK_THROWS_WITH(clip_grad_norm(plain, -1.0), Catch::Contains("max_norm"));
}
