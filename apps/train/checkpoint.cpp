#include "apps/train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "apps/train/health.h"
#include "dtensor/spec.h"
#include "parallel/checkpoint/reshard.h"
#include "models/formats/mapped_file.h"
#include "models/formats/safetensors.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace fs = std::filesystem;

namespace dtr::train {
namespace {

struct LocalBlock {
  Tensor local;  // this rank's block (plain tensor, shares the parameter's storage)
  Shape offset;
  Shape global_shape;
  std::string placements = "[]";
  Shape mesh_shape;
};

/// local_block plus the layout metadata.json records.
LocalBlock param_block(const Tensor& p) {
  LocalBlock b;
  TensorBlock tb = dtr::local_block(p, &b.global_shape);
  b.local = tb.tensor;
  b.offset = tb.offset;
  if (p.is_distributed()) {
    const DTensorSpec& s = dtensor_spec(p, "checkpoint");
    b.placements = placements_str(s.placements);
    b.mesh_shape = s.mesh.shape();
  }
  return b;
}

int64_t step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0) return -1;
  try {
    size_t pos = 0;
    const int64_t n = std::stoll(name.substr(5), &pos);
    return pos == name.size() - 5 ? n : -1;
  } catch (...) {
    return -1;
  }
}

std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t n = step_of(e.path().filename().string());
    if (n >= 0 && fs::exists(e.path() / "metadata.json")) out.emplace_back(n, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// True when every element of the plain tensor `t` is finite: x * 0 is 0 for finite x and NaN
/// for NaN / Inf, so the sum is NaN exactly when one element is not finite.
bool all_finite(const Tensor& t) {
  if (t.numel() == 0 || !is_floating(t.dtype())) return true;
  NoGradGuard no_grad;
  return std::isfinite(sum(mul(t.detach(), 0.0)).item<double>());
}

}  // namespace

void save_checkpoint(const std::string& root, int64_t step, const NamedParams& params, optim::Optimizer& opt,
                     const nlohmann::json& extra, int64_t keep_last, ProcessGroup& world) {
  const int rank = world.rank();
  // Never write (or prune for) a non-finite state: the index + 1 of this rank's first bad
  // parameter, the largest over the ranks, names it on every rank.
  int64_t bad = 0;
  for (size_t i = 0; i < params.size() && bad == 0; ++i)
    if (!all_finite(param_block(params[i].second).local)) bad = static_cast<int64_t>(i) + 1;
  Tensor flag = full({1}, static_cast<double>(bad), TensorOptions(DType::f64));
  world.all_reduce(flag, ReduceOp::MAX)->wait();
  bad = static_cast<int64_t>(flag.item<double>());
  if (bad > 0)
    throw AllRanksError(detail::cat("checkpoint: step ", step, ": parameter ", params[bad - 1].first,
                                    " holds NaN / Inf; not saved (earlier checkpoints under ", root, " kept)"));
  const fs::path final_dir = fs::path(root) / ("step_" + std::to_string(step));
  const fs::path tmp = fs::path(root) / (".tmp_step_" + std::to_string(step));
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    DTR_CHECK(!ec, "checkpoint: cannot create directory '", root, "': ", ec.message());
    for (const auto& e : fs::directory_iterator(root))
      if (e.path().filename().string().rfind(".tmp_step_", 0) == 0) fs::remove_all(e.path(), ec);
    fs::create_directories(tmp, ec);
    DTR_CHECK(!ec, "checkpoint: cannot create directory '", tmp.string(), "': ", ec.message());
  }
  world.barrier()->wait();

  nlohmann::json shards = nlohmann::json::object(), param_meta = nlohmann::json::object();
  std::vector<safetensors::RawTensor> raws;
  std::vector<Tensor> keep;  // contiguous copies alive until written
  auto add = [&](const std::string& name, const Tensor& t) {
    Tensor c = t.to(Device::cpu()).contiguous();  // CUDA shards are written from a host copy
    keep.push_back(c);
    raws.push_back({name, c.dtype(), c.sizes(), c.data_ptr(), c.nbytes()});
  };
  for (const auto& [fqn, p] : params) {
    LocalBlock b = param_block(p);
    add("model/" + fqn, b.local);
    int64_t st_step = 0;
    if (opt.has_state(p)) {
      auto& st = opt.state(p);
      st_step = st.step;
      for (const auto& [k, t] : st.tensors) add("optim/" + k + "/" + fqn, t);
    }
    shards[fqn] = {{"offset", b.offset}, {"global_shape", b.global_shape}, {"step", st_step}};
    param_meta[fqn] = {{"global_shape", b.global_shape},
                       {"placements", b.placements},
                       {"mesh_shape", b.mesh_shape},
                       {"dtype", dtype_name(b.local.dtype())}};
  }
  const std::string file = "rank_" + std::to_string(rank) + ".safetensors";
  // Each file also records its parameters' layout: under pipeline parallelism ranks hold
  // different parameters, and rank 0's metadata.json lists the union of every file's.
  safetensors::write_raw((tmp / file).string(), raws, {{"dtr_shards", shards.dump()}, {"dtr_params", param_meta.dump()}});
  world.barrier()->wait();
  if (rank == 0) {
    for (int r = 1; r < world.size(); ++r) {
      auto f = safetensors::SafetensorsFile::open((tmp / ("rank_" + std::to_string(r) + ".safetensors")).string());
      auto it = f.metadata().find("dtr_params");
      DTR_CHECK(it != f.metadata().end(), "checkpoint: ", f.path(), " has no dtr_params metadata");
      const nlohmann::json theirs = nlohmann::json::parse(it->second);
      for (const auto& [fqn, m] : theirs.items())
        if (!param_meta.contains(fqn)) param_meta[fqn] = m;
    }
    nlohmann::json meta;
    meta["step"] = step;
    meta["world_size"] = world.size();
    meta["params"] = param_meta;
    std::vector<std::string> files;
    for (int r = 0; r < world.size(); ++r) files.push_back("rank_" + std::to_string(r) + ".safetensors");
    meta["files"] = files;
    meta["extra"] = extra;
    {  // fsync'ed (the shard files are too), then the directory entries below
      const std::string text = meta.dump(1) + "\n";
      AtomicFileWriter f((tmp / "metadata.json").string());
      f.write(text.data(), text.size());
      f.commit();
    }
    std::error_code ec;
    fs::remove_all(final_dir, ec);
    fs::rename(tmp, final_dir, ec);
    DTR_CHECK(!ec, "checkpoint: cannot rename '", tmp.string(), "' to '", final_dir.string(), "': ", ec.message());
    fsync_directory(root);  // the rename itself is durable
    if (keep_last > 0) {
      auto all = complete_checkpoints(root);
      for (size_t i = 0; i + keep_last < all.size(); ++i) fs::remove_all(all[i].second, ec);
    }
  }
  world.barrier()->wait();
}

std::vector<std::string> checkpoints_newest_first(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& [n, p] : complete_checkpoints(root)) out.insert(out.begin(), p.string());
  return out;
}

nlohmann::json read_checkpoint_metadata(const std::string& dir) {
  const std::string path = (fs::path(dir) / "metadata.json").string();
  std::ifstream f(path);
  DTR_CHECK(f.good(), "checkpoint: cannot read '", path, "'");
  nlohmann::json meta;
  try {
    f >> meta;
  } catch (const std::exception& e) {
    DTR_ERROR("checkpoint: '", path, "' is not valid JSON: ", e.what());
  }
  // Every field the loader and dtr-train read, with its type, so that a damaged file is one
  // error naming the file and the field (not a raw json exception).
  auto need = [&](const nlohmann::json& j, const std::string& key, bool ok_type, const char* type) {
    DTR_CHECK(j.is_object() && j.contains(key), "checkpoint: '", path, "': field '", key, "' is missing");
    DTR_CHECK(ok_type, "checkpoint: '", path, "': field '", key, "' must be ", type, ", got ", j[key].dump());
  };
  DTR_CHECK(meta.is_object(), "checkpoint: '", path, "': expected a JSON object");
  need(meta, "step", meta.contains("step") && meta["step"].is_number_integer(), "an integer");
  need(meta, "files", meta.contains("files") && meta["files"].is_array(), "a list of file names");
  for (const auto& n : meta["files"])
    DTR_CHECK(n.is_string(), "checkpoint: '", path, "': field 'files' must hold strings, got ", n.dump());
  need(meta, "params", meta.contains("params") && meta["params"].is_object(), "an object");
  for (const auto& [fqn, p] : meta["params"].items())
    DTR_CHECK(p.is_object() && p.contains("global_shape") && p["global_shape"].is_array(), "checkpoint: '", path,
              "': field 'params.", fqn, ".global_shape' is missing or not a list");
  need(meta, "extra", meta.contains("extra") && meta["extra"].is_object(), "an object");
  const nlohmann::json& x = meta["extra"];
  need(x, "step", x.contains("step") && x["step"].is_number_integer(), "an integer (extra.step)");
  need(x, "lr_step", x.contains("lr_step") && x["lr_step"].is_number_integer(), "an integer (extra.lr_step)");
  need(x, "sampler", x.contains("sampler") && x["sampler"].is_object(), "an object (extra.sampler)");
  need(x, "rng", x.contains("rng") && x["rng"].is_object() && x["rng"].contains("seed") &&
                     x["rng"]["seed"].is_number_unsigned() && x["rng"].contains("offset") &&
                     x["rng"]["offset"].is_number_unsigned(),
       "an object with unsigned seed and offset (extra.rng)");
  return meta;
}

std::string checkpoint_problem(const std::string& dir) {
  try {
    const nlohmann::json meta = read_checkpoint_metadata(dir);
    for (const auto& name : meta["files"]) {
      const std::string file = (fs::path(dir) / name.get<std::string>()).string();
      DTR_CHECK(fs::exists(file), "checkpoint: shard file '", file, "' listed in metadata.json is missing");
      auto f = safetensors::SafetensorsFile::open(file);
      auto it = f.metadata().find("dtr_shards");
      DTR_CHECK(it != f.metadata().end(), "checkpoint: '", file, "' has no dtr_shards metadata");
      const auto blocks = nlohmann::json::parse(it->second, nullptr, false);
      DTR_CHECK(blocks.is_object(), "checkpoint: '", file, "': dtr_shards metadata is not a JSON object");
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::optional<std::string> find_latest_checkpoint(const std::string& root) {
  auto all = complete_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

nlohmann::json load_checkpoint(const std::string& dir, const NamedParams& params, optim::Optimizer& opt) {
  const nlohmann::json meta = read_checkpoint_metadata(dir);
  struct Shard {
    safetensors::SafetensorsFile file;
    nlohmann::json blocks;
  };
  std::vector<Shard> shards;
  for (const auto& name : meta.at("files")) {
    auto f = safetensors::SafetensorsFile::open((fs::path(dir) / name.get<std::string>()).string());
    auto it = f.metadata().find("dtr_shards");
    DTR_CHECK(it != f.metadata().end(), "checkpoint: ", f.path(), " has no dtr_shards metadata");
    shards.push_back({f, nlohmann::json::parse(it->second)});
  }
  NoGradGuard no_grad;
  for (const auto& [fqn, p] : params) {
    DTR_CHECK(meta.at("params").contains(fqn), "checkpoint: parameter ", fqn, " is not in ", dir,
              " (was it saved with the same model / peft settings?)");
    LocalBlock b = param_block(p);
    const Shape saved_global = meta["params"][fqn].at("global_shape").get<Shape>();
    DTR_CHECK(saved_global == b.global_shape, "checkpoint: ", fqn, " has global shape ", saved_global, " in ", dir,
              " but the model has ", b.global_shape);
    // Fills `dst` (local shape of this rank) from the blocks named `key` of every shard.
    // Fills `dst` (local shape of this rank) from the blocks named `key` of every shard
    // (parallel/checkpoint/reshard.h: any saved mesh and placements).
    auto assemble = [&](const std::string& key, Tensor dst) -> bool {
      std::vector<TensorBlock> saved;
      for (auto& s : shards) {
        if (!s.file.contains(key)) continue;
        const auto& e = s.file.entry(key);
        DTR_CHECK(e.dtype == dst.dtype(), "checkpoint: ", key, " is ", dtype_name(e.dtype), " in ", s.file.path(),
                  ", expected ", dtype_name(dst.dtype()));
        saved.push_back({s.file.get(key, safetensors::LoadMode::view), s.blocks.at(fqn).at("offset").get<Shape>()});
      }
      if (saved.empty()) return false;
      Tensor scratch = empty(dst.sizes(), TensorOptions(dst.dtype()));
      assemble_block(saved, {scratch, b.offset}, "checkpoint: shards of " + key + " in " + dir);
      dst.copy_(scratch);
      return true;
    };
    DTR_CHECK(assemble("model/" + fqn, b.local), "checkpoint: no shard of ", fqn, " in ", dir);
    int64_t st_step = 0;
    for (const auto& s : shards)
      if (s.blocks.contains(fqn)) st_step = std::max<int64_t>(st_step, s.blocks[fqn].at("step").get<int64_t>());
    if (st_step > 0) {
      auto& st = opt.state(p);
      st.step = st_step;
      for (const char* k : {"exp_avg", "exp_avg_sq"}) {
        const std::string key = std::string("optim/") + k + "/" + fqn;
        for (const auto& s : shards) {
          if (!s.file.contains(key)) continue;
          Tensor t = zeros(b.local.sizes(), TensorOptions(s.file.entry(key).dtype));
          if (assemble(key, t)) st.tensors[k] = t;
          break;
        }
      }
    }
  }
  return meta.at("extra");
}

}  // namespace dtr::train
