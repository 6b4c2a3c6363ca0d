#include "models/formats/sharded_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "tensor/error.h"

namespace dtr::safetensors {

namespace fs = std::filesystem;
using nlohmann::json;

ShardIndex read_index(const std::string& path) {
  const std::string text = read_file_to_string(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    DTR_ERROR(path, ": JSON error at byte ", e.byte, ": ", e.what());
  } catch (const json::exception& e) {  // e.g. out_of_range: a number too large for a double
    DTR_ERROR(path, ": JSON error: ", e.what());
  }
  DTR_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), path,
            ": missing object key 'weight_map'");
  ShardIndex idx;
  if (j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("total_size")) {
    const json& ts = j["metadata"]["total_size"];
    DTR_CHECK(ts.is_number_unsigned() || (ts.is_number_integer() && ts.get<int64_t>() >= 0), path,
              ": metadata.total_size is not a non-negative integer");
    idx.total_size = ts.get<uint64_t>();
  }
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    DTR_CHECK(it.value().is_string(), path, ": weight_map[\"", it.key(), "\"] is not a string");
    std::string shard = it.value().get<std::string>();
    DTR_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "..", path, ": weight_map[\"",
              it.key(), "\"] = '", shard, "' is not a file name in the checkpoint directory");
    idx.weight_map[it.key()] = shard;
  }
  return idx;
}

void write_index(const ShardIndex& index, const std::string& path) {
  json j = {{"metadata", {{"total_size", index.total_size}}}, {"weight_map", index.weight_map}};
  const std::string s = j.dump(2) + "\n";
  AtomicFileWriter w(path);
  w.write(s.data(), s.size());
  w.commit();
}

namespace {
std::string shard_name(const std::string& prefix, size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return prefix + buf;
}
}  // namespace

std::vector<std::string> save_sharded(const TensorMap& tensors, const std::string& dir, uint64_t max_shard_bytes,
                                      const std::map<std::string, std::string>& metadata, const std::string& prefix) {
  DTR_CHECK(max_shard_bytes > 0, "save_sharded: max_shard_bytes must be positive");
  fs::create_directories(dir);
  // Greedy split in name order.
  std::vector<TensorMap> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    DTR_CHECK(t.defined(), "save_sharded: tensor '", name, "' is undefined");
    const uint64_t nb = t.nbytes();
    if (cur > 0 && cur + nb > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back()[name] = t;
    cur += nb;
    total += nb;
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    const std::string p = (fs::path(dir) / (prefix + ".safetensors")).string();
    save_file(shards[0], p, metadata);
    written.push_back(p);
    return written;
  }
  ShardIndex idx;
  idx.total_size = total;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_name(prefix, i, shards.size());
    const std::string p = (fs::path(dir) / name).string();
    save_file(shards[i], p, metadata);
    written.push_back(p);
    for (const auto& kv : shards[i]) idx.weight_map[kv.first] = name;
  }
  const std::string ip = (fs::path(dir) / (prefix + ".safetensors.index.json")).string();
  write_index(idx, ip);
  written.push_back(ip);
  return written;
}

std::map<std::string, std::shared_ptr<const SafetensorsFile>> open_checkpoint(const std::string& path) {
  fs::path p(path);
  if (fs::is_directory(p)) {
    if (fs::exists(p / "model.safetensors.index.json")) return open_checkpoint((p / "model.safetensors.index.json").string());
    if (fs::exists(p / "model.safetensors")) return open_checkpoint((p / "model.safetensors").string());
    DTR_ERROR(path, ": no model.safetensors.index.json or model.safetensors in this directory");
  }
  const std::string s = p.string();
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> out;
  if (s.size() < 5 || s.substr(s.size() - 5) != ".json") {
    auto f = std::make_shared<const SafetensorsFile>(SafetensorsFile::open(s));
    for (const auto& k : f->keys()) out[k] = f;
    return out;
  }
  const ShardIndex idx = read_index(s);
  std::map<std::string, std::set<std::string>> by_shard;
  for (const auto& [t, shard] : idx.weight_map) by_shard[shard].insert(t);
  for (const auto& [shard, names] : by_shard) {
    const std::string sp = (p.parent_path() / shard).string();
    auto f = std::make_shared<const SafetensorsFile>(SafetensorsFile::open(sp));
    for (const auto& n : names)
      DTR_CHECK(f->contains(n), s, ": weight_map says tensor '", n, "' is in ", shard, " but that file lacks it");
    for (const auto& k : f->keys())
      DTR_CHECK(names.count(k), sp, ": holds tensor '", k, "' that the index ", s, " does not list");
    for (const auto& n : names) out[n] = f;
  }
  return out;
}

TensorMap load_checkpoint(const std::string& path, LoadMode mode) {
  TensorMap out;
  for (const auto& [name, f] : open_checkpoint(path)) out[name] = f->get(name, mode);
  return out;
}

}  // namespace dtr::safetensors
