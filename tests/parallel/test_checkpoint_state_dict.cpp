// parallel/checkpoint/state_dict.h with the file-system safetensors storage
// (models/formats/dcp_filesystem.h), no dtr-train: a state dict of DTensors and plain tensors
// saved under one mesh / placement (FSDP Shard(0), TP Shard(1), 2-D Shard(0) x Shard(1), a
// 2-rank sub-mesh = fewer ranks, a plain whole tensor = 1 rank) loads under every other, each
// local block equal bit for bit to distribute_tensor's shard of the single-process tensor and
// full_tensor equal to it (7 x 5 over 2-4 ranks: uneven, an empty shard at 4). A failed save
// leaves the previous checkpoint; a missing key, a shape / dtype mismatch, a truncated or
// missing file are one-line errors naming the key / file and what was expected.
#include <catch2/catch.hpp>

#include <filesystem>
#include <unistd.h>

#include "dtensor/api.h"
#include "models/formats/dcp_filesystem.h"
#include "parallel/checkpoint/state_dict.h"
#include "runtime/device_mesh.h"
#include "runtime/env.h"
#include "tensor/error.h"
#include "tensor/ops.h"

using namespace dtr;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

/// The single-process tensors: w 7 x 5 f32 (0..34), b [5] bf16, n [3] i64.
dcp::StateDict global_state(double shift = 0) {
  return {{"w", add(reshape(arange(0, 35, 1, TensorOptions(DType::f32)), {7, 5}), shift)},
          {"b", add(arange(0, 5, 1, TensorOptions(DType::f32)), 0.5 + shift).to(DType::bf16)},
          {"n", from_vector<int64_t>({3, 1, 4}, {3})}};
}

/// A layout: how each key of global_state is placed (a mesh + placements per key; no mesh = plain).
struct Layout {
  std::string name;
  std::optional<DeviceMesh> mesh;
  Placements w, b;
};

std::vector<Layout> layouts() {
  const int n = world_size();
  DeviceMesh world({n}, {"world"});
  std::vector<Layout> out = {{"fsdp", world, {Shard(0)}, {Shard(0)}},
                             {"tp", world, {Shard(1)}, {Replicate()}},
                             {"plain", std::nullopt, {}, {}}};
  if (n == 4) {
    DeviceMesh m2({2, 2}, {"dp", "tp"});
    out.push_back({"2d", m2, {Shard(0), Shard(1)}, {Replicate(), Shard(0)}});
    out.push_back({"2ranks", m2["tp"], {Shard(0)}, {Shard(0)}});  // replicated over dp: saved once
  }
  return out;
}

dcp::StateDict place(const dcp::StateDict& g, const Layout& l) {
  dcp::StateDict sd;
  for (const auto& [k, t] : g) {
    if (!l.mesh || k == "n") {
      sd[k] = t.clone();
    } else {
      sd[k] = distribute_tensor(t, *l.mesh, k == "w" ? l.w : l.b);
    }
  }
  return sd;
}

/// A directory every rank names alike: rank 0's pid.
std::string shared_dir(const std::string& tag) {
  Tensor pid = from_vector<int64_t>({static_cast<int64_t>(::getpid())}, {1});
  DeviceMesh::world().group(0)->broadcast(pid, 0)->wait();
  return (fs::temp_directory_path() / ("dtr_dcp_" + tag + "_" + std::to_string(pid.to_vector<int64_t>()[0]))).string();
}

ProcessGroup& world_group() {
  static DeviceMesh w = DeviceMesh::world();
  return *w.group(0);
}

void barrier() { world_group().barrier()->wait(); }

template <class T>
std::vector<T> values(const Tensor& t) {
  Tensor l = t.is_distributed() ? local_tensor(t) : t;
  return l.contiguous().to(dtype_of<T>::value).template to_vector<T>();
}

}  // namespace

TEST_CASE("save_state_dict on one layout, load_state_dict on every other", "[checkpoint]") {
  const std::string root = shared_dir("reshard");
  const dcp::StateDict g = global_state();
  for (const auto& from : layouts()) {
    const std::string dir = root + "/" + from.name;
    dcp::FileSystemWriter w(dir);
    dcp::save_state_dict(place(g, from), w, world_group(), {{"step", 7}});
    for (const auto& to : layouts()) {
      INFO("saved as " << from.name << ", loaded as " << to.name);
      dcp::StateDict dst = place(global_state(100), to);  // other values, to be overwritten
      dcp::FileSystemReader r(dir);
      const dcp::Metadata md = dcp::load_state_dict(dst, r);
      CHECK(md.extra.at("step") == 7);
      CHECK(md.world_size == world_size());
      const dcp::StateDict want = place(g, to);
      CHECK(values<float>(dst.at("w")) == values<float>(want.at("w")));
      CHECK(values<float>(dst.at("b")) == values<float>(want.at("b")));
      CHECK(values<int64_t>(dst.at("n")) == values<int64_t>(want.at("n")));
      for (const char* k : {"w", "b"}) {
        const Tensor full = dst.at(k).is_distributed() ? full_tensor(dst.at(k)) : dst.at(k);
        CHECK(values<float>(full) == values<float>(g.at(k)));
      }
    }
    // A replicated chunk is written once: every saved element exactly once per chunk list.
    dcp::FileSystemReader r(dir);
    const dcp::Metadata md = r.read_metadata();
    int64_t saved = 0;
    for (const auto& c : md.state_dict_metadata.at("w").chunks) saved += shape_numel(c.sizes);
    CHECK(saved == 35);
  }
  barrier();
  if (rank() == 0) fs::remove_all(root);
}

TEST_CASE("a failed save leaves the previous checkpoint; a new save replaces it", "[checkpoint]") {
  const std::string root = shared_dir("atomic");
  const std::string dir = root + "/step_1";
  const Layout fsdp = layouts()[0];
  {
    dcp::FileSystemWriter w(dir);
    dcp::save_state_dict(place(global_state(), fsdp), w, world_group());
  }
  struct FailingWriter : dcp::FileSystemWriter {
    using dcp::FileSystemWriter::FileSystemWriter;
    void write_data(int r, const std::vector<dcp::WriteItem>& items) override {
      if (r == world_size() - 1) DTR_ERROR("disk full (test) on rank ", r);
      dcp::FileSystemWriter::write_data(r, items);
    }
  };
  FailingWriter fw(dir);
  // Every rank raises the failing rank's message (none waits in a collective).
  CHECK_THROWS_WITH(dcp::save_state_dict(place(global_state(1), fsdp), fw, world_group()),
                    "disk full (test) on rank " + std::to_string(world_size() - 1));
  dcp::StateDict dst = place(global_state(100), fsdp);
  dcp::FileSystemReader r(dir);
  dcp::load_state_dict(dst, r);
  CHECK(values<float>(dst.at("w")) == values<float>(place(global_state(), fsdp).at("w")));
  // Saving again into the same directory replaces it as a whole.
  dcp::FileSystemWriter w2(dir);
  dcp::save_state_dict(place(global_state(1), fsdp), w2, world_group());
  dcp::FileSystemReader r2(dir);
  dcp::load_state_dict(dst, r2);
  CHECK(values<float>(dst.at("w")) == values<float>(place(global_state(1), fsdp).at("w")));
  CHECK_FALSE(fs::exists(root + "/.old_step_1"));
  barrier();
  if (rank() == 0) fs::remove_all(root);
}

TEST_CASE("load_state_dict names the key, the file and what was expected", "[checkpoint]") {
  const std::string root = shared_dir("bad");
  const std::string dir = root + "/ck";
  const Layout fsdp = layouts()[0];
  dcp::FileSystemWriter w(dir);
  dcp::save_state_dict(place(global_state(), fsdp), w, world_group());
  dcp::FileSystemReader r(dir);
  CHECK_THROWS_WITH(dcp::load_state_dict({{"nope", zeros({2})}}, r),
                    "dcp: key 'nope' is not in " + dir + " (it holds 3 keys)");
  CHECK_THROWS_WITH(dcp::load_state_dict({{"w", zeros({7, 4})}}, r),
                    "dcp: key 'w' has global shape [7, 5] in " + dir + " but the destination has [7, 4]");
  CHECK_THROWS_WITH(dcp::load_state_dict({{"w", zeros({7, 5}, TensorOptions(DType::f64))}}, r),
                    "dcp: key 'w' is float32 in " + dir + " but the destination is float64");
  // A Partial DTensor is refused before anything is written.
  DeviceMesh world({world_size()}, {"world"});
  Tensor partial = from_local(zeros({7, 5}), world, {Partial()});
  CHECK_THROWS_WITH(dcp::save_state_dict({{"p", partial}}, w, world_group()), Contains("'p' has Partial placements"));
  // So is a StridedShard without its partner dim (several row ranges per rank, not one block).
  if (world_size() > 1) {
    Tensor strided = distribute_tensor(global_state().at("w"), world, {StridedShard(0, 2)});
    CHECK_THROWS_WITH(dcp::save_state_dict({{"s", strided}}, w, world_group()), Contains("not one block"));
  }
  barrier();
  // A truncated rank file and a missing one (copies of the checkpoint; rank 0 damages them).
  if (rank() == 0) {
    fs::copy(dir, root + "/trunc");
    fs::resize_file(root + "/trunc/rank_0.safetensors", fs::file_size(root + "/trunc/rank_0.safetensors") - 8);
    fs::copy(dir, root + "/gone");
    fs::remove(root + "/gone/rank_0.safetensors");
  }
  barrier();
  dcp::FileSystemReader trunc(root + "/trunc"), gone(root + "/gone");
  CHECK_THROWS_WITH(trunc.check(), Contains(root + "/trunc/rank_0.safetensors: ") && Contains("run past the end"));
  CHECK_THROWS_WITH(dcp::load_state_dict(place(global_state(), {"plain", std::nullopt, {}, {}}), trunc),
                    Contains(root + "/trunc/rank_0.safetensors: "));
  CHECK_THROWS_WITH(gone.check(), "checkpoint: shard file '" + root + "/gone/rank_0.safetensors' listed in metadata.json is missing");
  barrier();
  if (rank() == 0) fs::remove_all(root);
}
