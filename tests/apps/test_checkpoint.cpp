// apps/train/checkpoint.h: dtr-train's state dict (parameters, AdamW exp_avg / exp_avg_sq /
// step) saved and loaded back bit for bit; a checkpoint in the layout dtr-train wrote before
// the distributed checkpoint moved to parallel/checkpoint (two rank files with dtr_shards block
// maps and a step, metadata.json with "params") still loads, reassembled from both files.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "apps/train/checkpoint.h"
#include "models/formats/safetensors.h"
#include "runtime/device_mesh.h"
#include "tensor/ops.h"
#include "tensor/optim/adamw.h"

using namespace dtr;
namespace fs = std::filesystem;

namespace {

nlohmann::json train_extra(int64_t step) {
  return {{"step", step},
          {"lr_step", step},
          {"sampler", nlohmann::json::object()},
          {"rng", {{"seed", 1u}, {"offset", 2u}}}};
}

std::string temp_root(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() / ("dtr_train_ckpt_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

}  // namespace

TEST_CASE("dtr-train checkpoints round-trip parameters and AdamW state", "[checkpoint]") {
  const std::string root = temp_root("roundtrip");
  Tensor w = reshape(arange(0, 12, 1, TensorOptions(DType::f32)), {4, 3});
  optim::AdamW opt(std::vector<Tensor>{w});
  auto& st = opt.state(w);
  st.step = 3;
  st.tensors["exp_avg"] = full({4, 3}, 0.25);
  st.tensors["exp_avg_sq"] = full({4, 3}, 0.5);
  DeviceMesh world = DeviceMesh::world();
  train::save_checkpoint(root, 3, {{"w", w}}, opt, train_extra(3), 0, *world.group(0));
  REQUIRE(train::find_latest_checkpoint(root) == root + "/step_3");
  CHECK(train::checkpoint_problem(root + "/step_3").empty());
  Tensor w2 = zeros({4, 3});
  optim::AdamW opt2(std::vector<Tensor>{w2});
  const nlohmann::json extra = train::load_checkpoint(root + "/step_3", {{"w", w2}}, opt2);
  CHECK(extra.at("step") == 3);
  CHECK(w2.to_vector<float>() == w.to_vector<float>());
  REQUIRE(opt2.has_state(w2));
  CHECK(opt2.state(w2).step == 3);
  CHECK(opt2.state(w2).tensors.at("exp_avg").to_vector<float>() == std::vector<float>(12, 0.25f));
  CHECK(opt2.state(w2).tensors.at("exp_avg_sq").to_vector<float>() == std::vector<float>(12, 0.5f));
  fs::remove_all(root);
}

TEST_CASE("a checkpoint of the earlier dtr-train layout still loads", "[checkpoint]") {
  const std::string root = temp_root("legacy"), dir = root + "/step_5";
  fs::create_directories(dir);
  const Tensor g = reshape(arange(0, 12, 1, TensorOptions(DType::f32)), {4, 3});
  // Two ranks of an FSDP Shard(0) run: rows 0-1 and 2-3, with exp_avg = -w and step 5.
  for (int r = 0; r < 2; ++r) {
    Tensor rows = g.narrow(0, 2 * r, 2).contiguous(), m = mul(rows, -1.0).contiguous(), v = full({2, 3}, 1.0);
    const nlohmann::json shards = {{"w", {{"offset", {2 * r, 0}}, {"global_shape", {4, 3}}, {"step", 5}}}};
    safetensors::write_raw(dir + "/rank_" + std::to_string(r) + ".safetensors",
                           {{"model/w", DType::f32, {2, 3}, rows.data_ptr(), rows.nbytes()},
                            {"optim/exp_avg/w", DType::f32, {2, 3}, m.data_ptr(), m.nbytes()},
                            {"optim/exp_avg_sq/w", DType::f32, {2, 3}, v.data_ptr(), v.nbytes()}},
                           {{"dtr_shards", shards.dump()}});
  }
  const nlohmann::json meta = {{"step", 5},
                               {"world_size", 2},
                               {"params", {{"w", {{"global_shape", {4, 3}}, {"placements", "[S(0)]"}}}}},
                               {"files", {"rank_0.safetensors", "rank_1.safetensors"}},
                               {"extra", train_extra(5)}};
  std::ofstream(dir + "/metadata.json") << meta.dump(1);
  CHECK(train::checkpoint_problem(dir).empty());
  Tensor w = zeros({4, 3});
  optim::AdamW opt(std::vector<Tensor>{w});
  CHECK(train::load_checkpoint(dir, {{"w", w}}, opt).at("step") == 5);
  CHECK(w.to_vector<float>() == g.to_vector<float>());
  CHECK(opt.state(w).step == 5);
  CHECK(opt.state(w).tensors.at("exp_avg").to_vector<float>() == mul(g, -1.0).to_vector<float>());
  CHECK(opt.state(w).tensors.at("exp_avg_sq").to_vector<float>() == std::vector<float>(12, 1.0f));
  // A missing rank file is named.
  fs::remove(dir + "/rank_1.safetensors");
  CHECK(train::checkpoint_problem(dir) == "checkpoint: shard file '" + dir + "/rank_1.safetensors' listed in metadata.json is missing");
  fs::remove_all(root);
}
