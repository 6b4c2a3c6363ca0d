#include "models/formats/json_keys.h"

#include "tensor/error.h"

namespace dtr::json_keys {

using nlohmann::json;

int64_t req_int(const json& j, const char* key, const std::string& src) {
  DTR_CHECK(j.contains(key), src, ": missing required key '", key, "'");
  DTR_CHECK(j[key].is_number_integer(), src, ": key '", key, "' must be an integer, got ", j[key].dump());
  return j[key].get<int64_t>();
}

int64_t opt_int(const json& j, const char* key, int64_t def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  DTR_CHECK(j[key].is_number_integer(), src, ": key '", key, "' must be an integer, got ", j[key].dump());
  return j[key].get<int64_t>();
}

double opt_num(const json& j, const char* key, double def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  DTR_CHECK(j[key].is_number(), src, ": key '", key, "' must be a number, got ", j[key].dump());
  return j[key].get<double>();
}

bool opt_bool(const json& j, const char* key, bool def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  DTR_CHECK(j[key].is_boolean(), src, ": key '", key, "' must be true or false, got ", j[key].dump());
  return j[key].get<bool>();
}

std::string opt_str(const json& j, const char* key, const std::string& def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  DTR_CHECK(j[key].is_string(), src, ": key '", key, "' must be a string, got ", j[key].dump());
  return j[key].get<std::string>();
}

}  // namespace dtr::json_keys
