#include "bench/dtensor_overhead.h"

#include <cstdio>

#include "bench/bench_util.h"
#include "dtensor/api.h"
#include "dtensor/propagation.h"
#include "runtime/env.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace dtr::bench {

int bench_dtensor(int argc, char** argv) {
  (void)argc;
  (void)argv;
  NoGradGuard ng;
  manual_seed(5);
  DeviceMesh mesh = DeviceMesh::world("w");
  const int64_t n = 4 * mesh.size();
  Tensor a = randn({n, 4}), b = randn({n, 4});
  Tensor da = distribute_tensor(a, mesh, {Shard(0)}), db = distribute_tensor(b, mesh, {Shard(0)});
  Tensor la = local_tensor(da), lb = local_tensor(db);
  const int inner = 5000;
  const double t_local = median_seconds([&] { Tensor c = add(la, lb); }, 7, inner);
  const double t_hit = median_seconds([&] { Tensor c = add(da, db); }, 7, inner);
  double scalar = 0.0;
  const double t_miss = median_seconds(
      [&] {
        scalar += 1.0;  // a new scalar each call: a new cache key
        Tensor c = add(da, scalar);
      },
      7, 500);
  const double t_local_s = median_seconds([&] { Tensor c = add(la, 1.0); }, 7, inner);
  DTensorSpec spec = dtensor_spec(da);
  const double t_plan = median_seconds([&] { auto p = plan_redistribute(spec, {Replicate()}); }, 7, inner);
  if (rank() == 0) {
    std::printf("dtr-bench dtensor: mesh %s, [%ld, 4] f32 Shard(0), median of 7 (us per op)\n", mesh.str().c_str(),
                static_cast<long>(n));
    std::printf("  local add (plain tensors)          %8.3f\n", t_local * 1e6);
    std::printf("  DTensor add, propagation cache hit %8.3f   (+%.3f over local, target < 5)\n", t_hit * 1e6,
                (t_hit - t_local) * 1e6);
    std::printf("  DTensor add scalar, cache miss     %8.3f   (local %.3f)\n", t_miss * 1e6, t_local_s * 1e6);
    std::printf("  redistribute planning S(0)->R      %8.3f\n", t_plan * 1e6);
  }
  return 0;
}

}  // namespace dtr::bench
