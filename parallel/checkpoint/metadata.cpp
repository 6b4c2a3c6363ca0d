#include "parallel/checkpoint/metadata.h"

#include "tensor/error.h"

namespace dtr::dcp {

using nlohmann::json;

json to_json(const Metadata& md) {
  json sd = json::object();
  for (const auto& [key, t] : md.state_dict_metadata) {
    json chunks = json::array();
    for (const auto& c : t.chunks) chunks.push_back({{"storage", c.storage}, {"offset", c.offsets}, {"shape", c.sizes}});
    sd[key] = {{"dtype", dtype_name(t.dtype)},
               {"global_shape", t.size},
               {"placements", t.placements},
               {"mesh_shape", t.mesh_shape},
               {"chunks", chunks}};
  }
  return {{"world_size", md.world_size}, {"state_dict", sd}, {"extra", md.extra}};
}

Shape shape_from_json(const json& j, const char* field, const std::string& path, const std::string& where) {
  DTR_CHECK(j.contains(field) && j[field].is_array(), where, ": field '", path, ".", field,
            "' is missing or not a list");
  Shape s;
  for (const auto& v : j[field]) {
    DTR_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, where, ": field '", path, ".", field,
              "' must hold non-negative integers, got ", v.dump());
    s.push_back(v.get<int64_t>());
  }
  return s;
}

void check_chunk(const std::string& key, const TensorMetadata& t, const ChunkMetadata& c, const std::string& where) {
  DTR_CHECK(c.offsets.size() == t.size.size() && c.sizes.size() == t.size.size(), where, ": a chunk of '", key,
            "' has offset ", c.offsets, " and shape ", c.sizes, " for global shape ", t.size);
  for (size_t d = 0; d < t.size.size(); ++d)
    DTR_CHECK(c.offsets[d] + c.sizes[d] <= t.size[d], where, ": a chunk of '", key, "' at offset ", c.offsets,
              " of shape ", c.sizes, " lies outside the global shape ", t.size);
}

Metadata metadata_from_json(const json& j, const std::string& where) {
  DTR_CHECK(j.is_object(), where, ": expected a JSON object");
  Metadata md;
  DTR_CHECK(j.contains("world_size") && j["world_size"].is_number_integer() && j["world_size"].get<int64_t>() > 0,
            where, ": field 'world_size' is missing or not a positive integer");
  md.world_size = j["world_size"].get<int>();
  DTR_CHECK(j.contains("state_dict") && j["state_dict"].is_object(), where, ": field 'state_dict' is missing or not an object");
  DTR_CHECK(j.contains("extra") && j["extra"].is_object(), where, ": field 'extra' is missing or not an object");
  md.extra = j["extra"];
  for (const auto& [key, e] : j["state_dict"].items()) {
    const std::string path = "state_dict." + key;
    DTR_CHECK(e.is_object(), where, ": field '", path, "' is not an object");
    TensorMetadata t;
    DTR_CHECK(e.contains("dtype") && e["dtype"].is_string(), where, ": field '", path, ".dtype' is missing");
    try {
      t.dtype = dtype_from_name(e["dtype"].get<std::string>());
    } catch (const Error& err) {
      DTR_ERROR(where, ": field '", path, ".dtype': ", err.what());
    }
    t.size = shape_from_json(e, "global_shape", path, where);
    if (e.contains("placements") && e["placements"].is_string()) t.placements = e["placements"].get<std::string>();
    if (e.contains("mesh_shape")) t.mesh_shape = shape_from_json(e, "mesh_shape", path, where);
    DTR_CHECK(e.contains("chunks") && e["chunks"].is_array(), where, ": field '", path, ".chunks' is missing or not a list");
    for (const auto& c : e["chunks"]) {
      DTR_CHECK(c.is_object() && c.contains("storage") && c["storage"].is_string(), where, ": field '", path,
                ".chunks[].storage' is missing");
      ChunkMetadata ch{shape_from_json(c, "offset", path + ".chunks[]", where),
                       shape_from_json(c, "shape", path + ".chunks[]", where), c["storage"].get<std::string>()};
      check_chunk(key, t, ch, where);
      t.chunks.push_back(std::move(ch));
    }
    md.state_dict_metadata[key] = std::move(t);
  }
  return md;
}

}  // namespace dtr::dcp
