// apps/train/checkpoint.h under mpirun: save_checkpoint refuses a NaN parameter on every rank
// with one message naming it, also when the ranks hold different parameter lists (pipeline
// stages): the last rank holds one parameter more than the others and the NaN is in it (an
// index past the other ranks' lists), or rank 0 holds the NaN in its first one.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "apps/train/checkpoint.h"
#include "apps/train/health.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"

using namespace dtr;
namespace fs = std::filesystem;

TEST_CASE("save_checkpoint names the non-finite parameter of any rank on every rank", "[checkpoint]") {
  DeviceMesh world = DeviceMesh::world();
  ProcessGroup& g = *world.group(0);
  const int r = rank(), last = world_size() - 1;
  const std::string root = (fs::temp_directory_path() / "dtr_ckpt_nan_unused").string();  // nothing is written
  for (int nan_rank : {last, 0}) {
    // Rank k holds "stage<k>.w"; the last rank also "stage<last>.extra" (NaN there when nan_rank is last).
    train::NamedParams params = {{"stage" + std::to_string(r) + ".w", full({2, 3}, r == 0 && nan_rank == 0 ? NAN : 1.0)}};
    if (r == last) params.push_back({"stage" + std::to_string(r) + ".extra", full({3}, nan_rank == last ? NAN : 1.0)});
    std::vector<Tensor> ts;
    for (const auto& p : params) ts.push_back(p.second);
    optim::AdamW opt(ts);
    const std::string want = nan_rank == 0 ? "stage0.w" : "stage" + std::to_string(last) + ".extra";
    CHECK_THROWS_AS(train::save_checkpoint(root, 1, params, opt, nlohmann::json::object(), 0, g), train::AllRanksError);
    CHECK_THROWS_WITH(train::save_checkpoint(root, 1, params, opt, nlohmann::json::object(), 0, g),
                      "checkpoint: step 1: parameter " + want + " (rank " + std::to_string(nan_rank) +
                          ") holds NaN / Inf; not saved (earlier checkpoints under " + root + " kept)");
  }
  CHECK_FALSE(fs::exists(root));
}
