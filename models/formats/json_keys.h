#pragma once
// Typed lookups of config.json keys with defaults; every wrong type or missing required key is a
// dtr::Error naming the key and the source (file) it came from.
#include <nlohmann/json.hpp>
#include <string>

namespace dtr::json_keys {

/// A required integer. Errors: missing, not an integer.
int64_t req_int(const nlohmann::json& j, const char* key, const std::string& src);
/// An integer, `def` when missing or null. Errors: not an integer.
int64_t opt_int(const nlohmann::json& j, const char* key, int64_t def, const std::string& src);
/// A number, `def` when missing or null. Errors: not a number.
double opt_num(const nlohmann::json& j, const char* key, double def, const std::string& src);
/// A boolean, `def` when missing or null. Errors: not true / false.
bool opt_bool(const nlohmann::json& j, const char* key, bool def, const std::string& src);
/// A string, `def` when missing or null. Errors: not a string.
std::string opt_str(const nlohmann::json& j, const char* key, const std::string& def, const std::string& src);

}  // namespace dtr::json_keys
