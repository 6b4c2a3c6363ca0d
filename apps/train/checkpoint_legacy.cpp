#include "apps/train/checkpoint_legacy.h"

#include <algorithm>
#include <filesystem>

#include "models/formats/dcp_filesystem.h"
#include "tensor/error.h"

namespace fs = std::filesystem;

namespace dtr::train {

bool is_legacy_checkpoint(const nlohmann::json& meta) {
  return meta.is_object() && !meta.contains("format") && meta.contains("params");
}

LegacyCheckpointReader::LegacyCheckpointReader(std::string dir) : dir_(std::move(dir)) {}

dcp::Metadata LegacyCheckpointReader::read_metadata() {
  const nlohmann::json meta = dcp::read_metadata_json(dir_);
  const std::string where = "checkpoint: '" + (fs::path(dir_) / "metadata.json").string() + "'";
  DTR_CHECK(meta.contains("files") && meta["files"].is_array(), where, ": field 'files' is missing or not a list");
  DTR_CHECK(meta.contains("extra") && meta["extra"].is_object(), where, ": field 'extra' is missing or not an object");
  dcp::Metadata md;
  md.extra = meta["extra"];
  md.world_size = static_cast<int>(meta["files"].size());
  files_.clear();
  steps_.clear();
  for (const auto& n : meta["files"]) {
    DTR_CHECK(n.is_string(), where, ": field 'files' must hold strings, got ", n.dump());
    const std::string name = n.get<std::string>(), path = (fs::path(dir_) / name).string();
    DTR_CHECK(fs::exists(path), "checkpoint: shard file '", path, "' listed in metadata.json is missing");
    auto f = std::make_shared<safetensors::SafetensorsFile>(safetensors::SafetensorsFile::open(path));
    files_[name] = f;
    auto it = f->metadata().find("dtr_shards");
    DTR_CHECK(it != f->metadata().end(), "checkpoint: '", path, "' has no dtr_shards metadata");
    const auto blocks = nlohmann::json::parse(it->second, nullptr, false);
    DTR_CHECK(blocks.is_object(), "checkpoint: '", path, "': dtr_shards metadata is not a JSON object");
    for (const auto& key : f->keys()) {
      // "model/<fqn>" or "optim/<k>/<fqn>": the parameter's block map entry.
      const size_t slash = key.rfind("optim/", 0) == 0 ? key.find('/', 6) : key.find('/');
      const std::string fqn = slash == std::string::npos ? key : key.substr(slash + 1);
      DTR_CHECK(blocks.contains(fqn) && blocks[fqn].is_object(), "checkpoint: '", path, "': dtr_shards has no block of '",
                fqn, "' (tensor '", key, "')");
      const auto& b = blocks[fqn];
      const std::string field = "dtr_shards." + fqn, in_file = "checkpoint: '" + path + "'";
      const Shape global_shape = dcp::shape_from_json(b, "global_shape", field, in_file);
      const auto& e = f->entry(key);
      dcp::TensorMetadata& t = md.state_dict_metadata[key];
      if (!t.chunks.empty()) {  // every file's block of a parameter gives its global shape: the same one
        DTR_CHECK(t.size == global_shape, in_file, ": '", key, "' has global shape ", global_shape, ", ",
                  t.chunks.front().storage, " says ", t.size);
        DTR_CHECK(t.dtype == e.dtype, in_file, ": '", key, "' is ", dtype_name(e.dtype), ", ", t.chunks.front().storage,
                  " holds it as ", dtype_name(t.dtype));
      }
      t.dtype = e.dtype;
      t.size = global_shape;
      t.chunks.push_back({dcp::shape_from_json(b, "offset", field, in_file), e.shape, name});
      dcp::check_chunk(key, t, t.chunks.back(), in_file);
      if (b.contains("step")) {
        DTR_CHECK(b["step"].is_number_integer(), in_file, ": field '", field, ".step' is not an integer, got ",
                  b["step"].dump());
        if (b["step"].get<int64_t>() > 0) {
          int64_t& s = steps_["optim/step/" + fqn];
          s = std::max(s, b["step"].get<int64_t>());
        }
      }
    }
  }
  for (const auto& [key, s] : steps_) md.state_dict_metadata[key] = {DType::i64, {1}, "[]", {}, {{{0}, {1}, ""}}};
  return md;
}

Tensor LegacyCheckpointReader::read_chunk(const std::string& key, const dcp::TensorMetadata&,
                                          const dcp::ChunkMetadata& c) {
  auto s = steps_.find(key);
  if (s != steps_.end()) return from_vector<int64_t>({s->second}, {1});
  auto f = files_.find(c.storage);
  DTR_CHECK(f != files_.end(), "checkpoint: ", dir_, ": no file '", c.storage, "' (read_metadata first)");
  return f->second->get(key, safetensors::LoadMode::view);
}

}  // namespace dtr::train
