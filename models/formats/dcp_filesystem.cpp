#include "models/formats/dcp_filesystem.h"

#include <filesystem>
#include <fstream>

#include "models/formats/mapped_file.h"
#include "tensor/error.h"

namespace fs = std::filesystem;

namespace dtr::dcp {

namespace {

constexpr const char* kFormat = "dtr-dcp/1";

std::string sibling(const std::string& path, const char* prefix) {
  const fs::path p(path);
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  return (parent / (prefix + p.filename().string())).string();
}

/// `j` as text: one top-level field per line, nested objects indented (extra stays easy to read
/// and edit), but each state_dict entry on one line (its chunk lists would otherwise take a
/// line per number).
std::string dump_metadata(const nlohmann::json& j) {
  nlohmann::json rest = j;
  rest.erase("state_dict");
  std::string text = rest.dump(1);  // "{\n ...\n}"
  std::string sd = " \"state_dict\": {";
  bool first = true;
  for (const auto& [key, v] : j.at("state_dict").items()) {
    sd += (first ? "\n  " : ",\n  ") + nlohmann::json(key).dump() + ": " + v.dump();
    first = false;
  }
  sd += first ? "}" : "\n }";
  text.insert(text.size() - 2, ",\n" + sd);  // rest always holds world_size, extra, format, files
  return text + "\n";
}

}  // namespace

FileSystemWriter::FileSystemWriter(std::string path) : path_(fs::path(std::move(path)).lexically_normal().string()) {
  if (!path_.empty() && path_.back() == '/') path_.pop_back();
}

std::string FileSystemWriter::temp_path() const { return sibling(path_, ".tmp_"); }

std::string FileSystemWriter::storage_name(int rank) const { return "rank_" + std::to_string(rank) + ".safetensors"; }

void FileSystemWriter::set_up(bool is_coordinator) {
  if (!is_coordinator) return;
  std::error_code ec;
  const std::string tmp = temp_path();
  fs::create_directories(fs::path(tmp).parent_path(), ec);
  DTR_CHECK(!ec, "checkpoint: cannot create directory '", fs::path(tmp).parent_path().string(), "': ", ec.message());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  DTR_CHECK(!ec, "checkpoint: cannot create directory '", tmp, "': ", ec.message());
}

void FileSystemWriter::write_data(int rank, const std::vector<WriteItem>& items) {
  std::vector<safetensors::RawTensor> raws;
  for (const auto& it : items) {
    DTR_CHECK(it.tensor.device().is_cpu() && it.tensor.is_contiguous(), "checkpoint: chunk of '", it.key,
              "' must be a contiguous CPU tensor");
    raws.push_back({it.key, it.tensor.dtype(), it.tensor.sizes(), it.tensor.numel() ? it.tensor.data_ptr() : nullptr,
                    it.tensor.nbytes()});
  }
  safetensors::write_raw((fs::path(temp_path()) / storage_name(rank)).string(), raws, {{"format", kFormat}});
}

void FileSystemWriter::finish(const Metadata& md) {
  const std::string tmp = temp_path();
  nlohmann::json j = to_json(md);
  j["format"] = kFormat;
  std::vector<std::string> files;
  for (int r = 0; r < md.world_size; ++r) files.push_back(storage_name(r));
  j["files"] = files;
  {  // fsync'ed like the rank files; the directory entries follow
    const std::string text = dump_metadata(j);
    AtomicFileWriter f((fs::path(tmp) / "metadata.json").string());
    f.write(text.data(), text.size());
    f.commit();
  }
  std::error_code ec;
  const std::string old = sibling(path_, ".old_");
  fs::remove_all(old, ec);
  const bool had = fs::exists(path_, ec);
  if (had) {
    fs::rename(path_, old, ec);
    DTR_CHECK(!ec, "checkpoint: cannot move '", path_, "' aside to '", old, "': ", ec.message());
  }
  fs::rename(tmp, path_, ec);
  DTR_CHECK(!ec, "checkpoint: cannot rename '", tmp, "' to '", path_, "': ", ec.message());
  fsync_directory(fs::path(path_).parent_path().empty() ? "." : fs::path(path_).parent_path().string());
  if (had) fs::remove_all(old, ec);
}

nlohmann::json read_metadata_json(const std::string& dir) {
  const std::string path = (fs::path(dir) / "metadata.json").string();
  std::ifstream f(path);
  DTR_CHECK(f.good(), "checkpoint: cannot read '", path, "'");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    DTR_ERROR("checkpoint: '", path, "' is not valid JSON: ", e.what());
  }
  DTR_CHECK(j.is_object(), "checkpoint: '", path, "': expected a JSON object");
  return j;
}

FileSystemReader::FileSystemReader(std::string path) : path_(std::move(path)) {}

Metadata FileSystemReader::read_metadata() {
  const nlohmann::json j = read_metadata_json(path_);
  const std::string where = "checkpoint: '" + (fs::path(path_) / "metadata.json").string() + "'";
  DTR_CHECK(j.contains("format") && j["format"] == kFormat, where, ": field 'format' is ",
            j.contains("format") ? j["format"].dump() : std::string("missing"), ", expected \"", kFormat, "\"");
  return metadata_from_json(j, where);
}

const safetensors::SafetensorsFile& FileSystemReader::file(const std::string& name) {
  auto& f = files_[name];
  if (!f) {
    DTR_CHECK(name.find('/') == std::string::npos, "checkpoint: storage name '", name, "' in ", path_,
              "/metadata.json is not a plain file name");
    const std::string p = (fs::path(path_) / name).string();
    DTR_CHECK(fs::exists(p), "checkpoint: shard file '", p, "' listed in metadata.json is missing");
    f = std::make_shared<safetensors::SafetensorsFile>(safetensors::SafetensorsFile::open(p));
  }
  return *f;
}

const safetensors::SafetensorsFile& FileSystemReader::chunk_file(const std::string& key, const TensorMetadata& t,
                                                                 const ChunkMetadata& c) {
  const auto& f = file(c.storage);
  DTR_CHECK(f.contains(key), "checkpoint: ", f.path(), " has no tensor '", key, "' (metadata.json lists a chunk at offset ",
            c.offsets, " there)");
  const auto& e = f.entry(key);
  DTR_CHECK(e.shape == c.sizes && e.dtype == t.dtype, "checkpoint: ", f.path(), ": tensor '", key, "' is ",
            dtype_name(e.dtype), " ", e.shape, ", metadata.json says ", dtype_name(t.dtype), " ", c.sizes);
  return f;
}

Tensor FileSystemReader::read_chunk(const std::string& key, const TensorMetadata& t, const ChunkMetadata& c) {
  return chunk_file(key, t, c).get(key, safetensors::LoadMode::view);
}

void FileSystemReader::check() {
  const nlohmann::json j = read_metadata_json(path_);
  const Metadata md = read_metadata();
  DTR_CHECK(j.contains("files") && j["files"].is_array(), "checkpoint: '", path_, "/metadata.json': field 'files' is missing");
  for (const auto& n : j["files"]) {
    DTR_CHECK(n.is_string(), "checkpoint: '", path_, "/metadata.json': field 'files' must hold strings, got ", n.dump());
    file(n.get<std::string>());
  }
  for (const auto& [key, t] : md.state_dict_metadata)
    for (const auto& c : t.chunks) chunk_file(key, t, c);
}

}  // namespace dtr::dcp
