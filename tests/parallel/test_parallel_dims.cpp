// ParallelDims (parallel/parallel_dims.h): derived sizes, validation messages and the meshes
// build_mesh makes, on 1-4 ranks (dp x tp and HSDP where the world allows).
#include <catch2/catch.hpp>

#include "parallel/parallel_dims.h"
#include "runtime/env.h"
#include "tensor/error.h"

using namespace dtr;

TEST_CASE("ParallelDims derives dp and the dims of its mesh", "[parallel_dims]") {
  ParallelDims d;
  d.world_size = 8;
  d.tp_size = 2;
  d.dp_replicate_size = 2;
  d.infer_dp_size("t");
  CHECK(d.dp_size == 4);
  CHECK(d.dp_shard_size() == 2);
  CHECK(d.dp_shard_cp_size() == 2);
  d.validate("t");
  const std::vector<ParallelDims::Dim> want{{"pp", 1}, {"dp_replicate", 2}, {"dp_shard", 2}, {"cp", 1}, {"tp", 2}};
  CHECK(d.mesh_dims() == want);
  CHECK(d.str() == "world=8 dp=4 (replicate 2 x shard 2) tp=2");
  d.ep_size = 2;
  CHECK(d.ep_shard_size() == 1);
  CHECK(d.str() == "world=8 dp=4 (replicate 2 x shard 2) tp=2 ep=2 (ep_shard 1)");
}

TEST_CASE("ParallelDims rejects bad sizes naming the key", "[parallel_dims]") {
  ParallelDims d;
  d.world_size = 4;
  d.dp_size = 4;
  d.dp_replicate_size = 3;
  CHECK_THROWS_WITH(d.validate("d"), "d.dp_replicate_size=3 does not divide dp_size=4");
  d.dp_replicate_size = 1;
  d.pp_size = 0;
  CHECK_THROWS_WITH(d.validate("d"), "d.pp_size=0: must be >= 1");
  d.pp_size = 1;
  d.dp_size = 2;
  CHECK_THROWS_WITH(d.validate("d"), "d: dp_size*tp_size*cp_size*pp_size = 2*1*1*1 = 2 != world size 4");
  d.ep_size = 3;
  d.dp_size = 4;
  CHECK_THROWS_WITH(d.validate("d"), Catch::StartsWith("d.ep_size=3 does not divide dp_shard_cp"));
  d.ep_size = 1;
  d.tp_size = 3;
  CHECK_THROWS_WITH(d.infer_dp_size("d"), Catch::Contains("world size 4 is not divisible by tp_size*cp_size*pp_size=3"));
  CHECK_THROWS_WITH(ParallelDims{}.tp_mesh(), Catch::Contains("build_mesh() was not called"));
}

TEST_CASE("ParallelDims::build_mesh: dims, flattened dp and this rank's dp index", "[parallel_dims]") {
  const int w = world_size();
  for (int64_t tp : {1, 2}) {
    for (int64_t rep : {1, 2}) {
      if (w % tp != 0 || (w / tp) % rep != 0) continue;
      INFO("tp " << tp << " dp_replicate " << rep);
      ParallelDims d;
      d.world_size = w;
      d.tp_size = tp;
      d.dp_replicate_size = rep;
      d.infer_dp_size("t");
      d.validate("t");
      d.build_mesh();
      CHECK(d.mesh->shape() == Shape{1, rep, w / tp / rep, 1, tp});
      CHECK(d.tp_mesh().size() == tp);
      CHECK(d.dp_mesh().size() == w / tp);
      // tp fastest: the dp index of a rank is rank / tp.
      CHECK(d.dp_rank() == rank() / tp);
      CHECK(d.fsdp_mesh().ndim() == (rep > 1 ? 2 : 1));
      CHECK(d.fsdp_tp_mesh().dim_names().back() == "tp");
    }
  }
}
