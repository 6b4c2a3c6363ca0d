// apps/train/checkpoint.h: dtr-train's state dict (parameters, AdamW exp_avg / exp_avg_sq /
// step) saved and loaded back bit for bit; a checkpoint in the layout dtr-train wrote before
// the distributed checkpoint moved to parallel/checkpoint (two rank files with dtr_shards block
// maps and a step, metadata.json with "params") still loads, reassembled from both files.
#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
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

namespace {

/// A checkpoint of the earlier layout in `dir`: two ranks of an FSDP Shard(0) run of w [4, 3]
/// (rows 0-1 and 2-3, exp_avg = -w, exp_avg_sq = 1, step 5); shards(r) is rank r's dtr_shards,
/// rank 1's parameter rows are stored as `rank1_dtype`.
void write_legacy(const std::string& dir, const Tensor& g, const std::function<nlohmann::json(int)>& shards,
                  DType rank1_dtype = DType::f32) {
  fs::create_directories(dir);
  for (int r = 0; r < 2; ++r) {
    Tensor rows = g.narrow(0, 2 * r, 2).contiguous().to(r == 1 ? rank1_dtype : DType::f32), m = mul(g.narrow(0, 2 * r, 2), -1.0).contiguous(), v = full({2, 3}, 1.0);
    safetensors::write_raw(dir + "/rank_" + std::to_string(r) + ".safetensors",
                           {{"model/w", rows.dtype(), {2, 3}, rows.data_ptr(), rows.nbytes()},
                            {"optim/exp_avg/w", DType::f32, {2, 3}, m.data_ptr(), m.nbytes()},
                            {"optim/exp_avg_sq/w", DType::f32, {2, 3}, v.data_ptr(), v.nbytes()}},
                           {{"dtr_shards", shards(r).dump()}});
  }
  const nlohmann::json meta = {{"step", 5},
                               {"world_size", 2},
                               {"params", {{"w", {{"global_shape", {4, 3}}, {"placements", "[S(0)]"}}}}},
                               {"files", {"rank_0.safetensors", "rank_1.safetensors"}},
                               {"extra", train_extra(5)}};
  std::ofstream(dir + "/metadata.json") << meta.dump(1);
}

nlohmann::json good_shards(int r) { return {{"w", {{"offset", {2 * r, 0}}, {"global_shape", {4, 3}}, {"step", 5}}}}; }

}  // namespace

TEST_CASE("a checkpoint of the earlier dtr-train layout still loads", "[checkpoint]") {
  const std::string root = temp_root("legacy"), dir = root + "/step_5";
  const Tensor g = reshape(arange(0, 12, 1, TensorOptions(DType::f32)), {4, 3});
  write_legacy(dir, g, good_shards);
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

TEST_CASE("a damaged checkpoint of the earlier layout is one line naming the file and the field", "[checkpoint]") {
  const std::string root = temp_root("legacy_bad");
  const Tensor g = reshape(arange(0, 12, 1, TensorOptions(DType::f32)), {4, 3});
  // rank_1's dtr_shards entry of w changed by `edit`; the problem checkpoint_problem reports.
  auto problem = [&](const std::string& tag, const std::function<void(nlohmann::json&)>& edit,
                     DType rank1_dtype = DType::f32) {
    const std::string dir = root + "/" + tag;
    write_legacy(
        dir, g,
        [&](int r) {
          nlohmann::json s = good_shards(r);
          if (r == 1) edit(s["w"]);
          return s;
        },
        rank1_dtype);
    return train::checkpoint_problem(dir);
  };
  const std::string f1 = "checkpoint: '" + root + "/";
  // Mistyped fields: not nlohmann's "[json.exception.type_error...]".
  CHECK(problem("step_type", [](auto& b) { b["step"] = "five"; }) ==
        f1 + "step_type/rank_1.safetensors': field 'dtr_shards.w.step' is not an integer, got \"five\"");
  CHECK(problem("offset_type", [](auto& b) { b["offset"] = "zero"; }) ==
        f1 + "offset_type/rank_1.safetensors': field 'dtr_shards.w.offset' is missing or not a list");
  CHECK(problem("shape_entry", [](auto& b) { b["global_shape"] = {4, -3}; }) ==
        f1 + "shape_entry/rank_1.safetensors': field 'dtr_shards.w.global_shape' must hold non-negative integers, got -3");
  CHECK(problem("block_type", [](auto& b) { b = 7; }) ==
        f1 + "block_type/rank_1.safetensors': dtr_shards has no block of 'w' (tensor 'model/w')");
  // A chunk past the global shape, of another rank than the shape, or a shape other files disagree with.
  CHECK(problem("past_shape", [](auto& b) { b["offset"] = {3, 0}; }) ==
        f1 + "past_shape/rank_1.safetensors': a chunk of 'model/w' at offset [3, 0] of shape [2, 3] lies outside the "
             "global shape [4, 3]");
  CHECK(problem("offset_rank", [](auto& b) { b["offset"] = {2}; }) ==
        f1 + "offset_rank/rank_1.safetensors': a chunk of 'model/w' has offset [2] and shape [2, 3] for global shape [4, 3]");
  CHECK(problem("shape_differs", [](auto& b) { b["global_shape"] = {6, 3}; }) ==
        f1 + "shape_differs/rank_1.safetensors': 'model/w' has global shape [6, 3], rank_0.safetensors says [4, 3]");
  CHECK(problem("dtype_differs", [](auto&) {}, DType::f64) ==
        f1 + "dtype_differs/rank_1.safetensors': 'model/w' is float64, rank_0.safetensors holds it as float32");
  // load_checkpoint raises the same line (no wrong load).
  Tensor w = zeros({4, 3});
  optim::AdamW opt(std::vector<Tensor>{w});
  try {
    train::load_checkpoint(root + "/past_shape", {{"w", w}}, opt);
    FAIL("load_checkpoint accepted a chunk past the global shape");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("lies outside the global shape [4, 3]") != std::string::npos);
  }
  CHECK(w.to_vector<float>() == std::vector<float>(12, 0.0f));
  fs::remove_all(root);
}
