#include "apps/train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "apps/train/checkpoint_legacy.h"
#include "apps/train/health.h"
#include "dtensor/spec.h"
#include "models/formats/dcp_filesystem.h"
#include "parallel/checkpoint/reshard.h"
#include "parallel/checkpoint/state_dict.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace fs = std::filesystem;

namespace dtr::train {
namespace {

/// `local` (this rank's block of parameter `p`, e.g. its AdamW state) as a tensor of p's
/// global layout: a DTensor with p's spec (and local's dtype) when p is one, else itself.
Tensor like_param(const Tensor& local, const Tensor& p) {
  if (!p.is_distributed()) return local;
  DTensorSpec spec = dtensor_spec(p, "checkpoint");
  spec.dtype = local.dtype();
  return make_dtensor(local, spec);
}

/// The reader of checkpoint `dir`: the distributed checkpoint's file-system layout, or the
/// layout dtr-train wrote before it (checkpoint_legacy.h).
std::unique_ptr<dcp::StorageReader> open_reader(const std::string& dir) {
  if (is_legacy_checkpoint(dcp::read_metadata_json(dir))) return std::make_unique<LegacyCheckpointReader>(dir);
  return std::make_unique<dcp::FileSystemReader>(dir);
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
  // Never write (or prune for) a non-finite state. The lowest rank holding one names its first
  // such parameter on every rank (its name is sent: pipeline stages hold different parameters).
  std::string bad;
  for (size_t i = 0; i < params.size() && bad.empty(); ++i)
    if (!all_finite(local_block(params[i].second).tensor)) bad = params[i].first;
  Tensor who = full({1}, static_cast<double>(bad.empty() ? world.size() : rank), TensorOptions(DType::f64));
  world.all_reduce(who, ReduceOp::MIN)->wait();
  if (const int src = static_cast<int>(who.item<double>()); src < world.size()) {
    constexpr int64_t kMaxName = 1024;  // bytes of the name sent (longer names are cut)
    std::vector<uint8_t> buf(kMaxName, 0);
    if (rank == src) std::memcpy(buf.data(), bad.data(), std::min<size_t>(bad.size(), kMaxName - 1));
    Tensor name = from_vector<uint8_t>(buf, {kMaxName});
    world.broadcast(name, src)->wait();
    const std::vector<uint8_t> got = name.to_vector<uint8_t>();
    throw AllRanksError(detail::cat("checkpoint: step ", step, ": parameter ", reinterpret_cast<const char*>(got.data()),
                                    " (rank ", src, ") holds NaN / Inf; not saved (earlier checkpoints under ", root,
                                    " kept)"));
  }
  // What is saved: every trainable parameter and its optimizer state (the step as a 1-element
  // i64 tensor), with the parameter's layout; non-tensor state (sampler, RNG, LR step) in extra.
  dcp::StateDict sd;
  for (const auto& [fqn, p] : params) {
    sd["model/" + fqn] = p;
    if (!opt.has_state(p)) continue;
    auto& st = opt.state(p);
    sd["optim/step/" + fqn] = from_vector<int64_t>({st.step}, {1});
    for (const auto& [k, t] : st.tensors) sd["optim/" + k + "/" + fqn] = like_param(t, p);
  }
  if (rank == 0) {  // temp / aside directories of interrupted saves
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(".tmp_step_", 0) == 0 || n.rfind(".old_step_", 0) == 0) fs::remove_all(e.path(), ec);
    }
  }
  dcp::FileSystemWriter writer((fs::path(root) / ("step_" + std::to_string(step))).string());
  try {
    dcp::save_state_dict(sd, writer, world, extra);
  } catch (const Error& e) {  // raised on every rank with the same message
    throw AllRanksError(e.what());
  }
  if (rank == 0 && keep_last > 0) {
    std::error_code ec;
    auto all = complete_checkpoints(root);
    for (size_t i = 0; i + keep_last < all.size(); ++i) fs::remove_all(all[i].second, ec);
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
  nlohmann::json meta = dcp::read_metadata_json(dir);
  open_reader(dir)->read_metadata();  // the storage's own fields
  // Every field dtr-train reads from extra, with its type, so that a damaged file is one
  // error naming the file and the field (not a raw json exception).
  auto need = [&](const nlohmann::json& j, const std::string& key, bool ok_type, const char* type) {
    DTR_CHECK(j.is_object() && j.contains(key), "checkpoint: '", path, "': field '", key, "' is missing");
    DTR_CHECK(ok_type, "checkpoint: '", path, "': field '", key, "' must be ", type, ", got ", j[key].dump());
  };
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
    read_checkpoint_metadata(dir);
    open_reader(dir)->check();
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
  read_checkpoint_metadata(dir);
  auto reader = open_reader(dir);
  const dcp::Metadata md = reader->read_metadata();
  const auto& saved = md.state_dict_metadata;
  // "optim/<k>/<fqn>" -> the state names k saved for each parameter.
  std::map<std::string, std::vector<std::string>> state_keys;
  for (const auto& [key, t] : saved) {
    if (key.rfind("optim/", 0) != 0) continue;
    const size_t slash = key.find('/', 6);
    if (slash != std::string::npos) state_keys[key.substr(slash + 1)].push_back(key.substr(6, slash - 6));
  }
  dcp::StateDict sd;
  std::map<std::string, Tensor> steps;  // fqn -> its step tensor
  for (const auto& [fqn, p] : params) {
    auto it = saved.find("model/" + fqn);
    DTR_CHECK(it != saved.end(), "checkpoint: parameter ", fqn, " is not in ", dir,
              " (was it saved with the same model / peft settings?)");
    Shape global;
    const Tensor local = local_block(p, &global).tensor;
    DTR_CHECK(it->second.size == global, "checkpoint: ", fqn, " has global shape ", it->second.size, " in ", dir,
              " but the model has ", global);
    sd["model/" + fqn] = p;
    if (!saved.count("optim/step/" + fqn)) continue;
    steps[fqn] = sd["optim/step/" + fqn] = zeros({1}, TensorOptions(DType::i64));
    for (const auto& k : state_keys[fqn]) {
      if (k == "step") continue;
      const std::string key = "optim/" + k + "/" + fqn;
      // On the parameter's device: AdamW's CUDA update takes param, grad and state on one device.
      sd[key] = like_param(zeros(local.sizes(), TensorOptions(saved.at(key).dtype).with_device(local.device())), p);
    }
  }
  dcp::load_state_dict(sd, *reader);
  for (const auto& [fqn, p] : params) {
    auto s = steps.find(fqn);
    if (s == steps.end() || s->second.item<int64_t>() == 0) continue;
    auto& st = opt.state(p);
    st.step = s->second.item<int64_t>();
    for (const auto& k : state_keys[fqn])
      if (k != "step") st.tensors[k] = local_block(sd.at("optim/" + k + "/" + fqn)).tensor;
  }
  return md.extra;
}

}  // namespace dtr::train
