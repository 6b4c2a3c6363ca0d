// PEFT LoRA adapters (see peft.h).
#include "models/lora/peft.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "models/formats/mapped_file.h"
#include "models/formats/safetensors.h"
#include "models/transformer/load.h"
#include "models/lora/module_matcher.h"
#include "models/lora/peft_experts.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/ops.h"

namespace dtr {

using nlohmann::json;

namespace {

constexpr const char* kPrefix = "base_model.model.";
constexpr const char* kWeights = "adapter_model.safetensors";
constexpr const char* kConfig = "adapter_config.json";

std::string leaf_name(const std::string& fqn) {
  const size_t dot = fqn.rfind('.');
  return dot == std::string::npos ? fqn : fqn.substr(dot + 1);
}

std::string regex_escape(const std::string& s) {
  static const std::string special = R"(\^$.|?*+()[]{})";
  std::string out;
  for (char ch : s) {
    if (special.find(ch) != std::string::npos) out += '\\';
    out += ch;
  }
  return out;
}

/// FQNs of the Linear / LoRALinear modules of `model` (adapter children excluded).
std::vector<std::string> linear_fqns(nn::Module& model) {
  std::vector<std::string> out;
  for (const auto& [fqn, m] : model.named_modules()) {
    if (fqn.empty() || fqn.ends_with(".lora_A") || fqn.ends_with(".lora_B")) continue;
    if (std::dynamic_pointer_cast<nn::Linear>(m) || std::dynamic_pointer_cast<nn::LoRALinear>(m)) out.push_back(fqn);
  }
  return out;
}

/// The GroupedExperts (MoE experts) of `model` with their FQNs.
std::vector<std::pair<std::string, std::shared_ptr<nn::GroupedExperts>>> grouped_experts(nn::Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<nn::GroupedExperts>>> out;
  for (const auto& [fqn, m] : model.named_modules())
    if (auto e = std::dynamic_pointer_cast<nn::GroupedExperts>(m); e && !fqn.empty()) out.emplace_back(fqn, e);
  return out;
}

/// PEFT's target_parameters rule (BaseTuner._inject_parameters): the key "<module>.<param>"
/// equals an entry or ends with "." + entry.
bool peft_parameter_targeted(const std::vector<std::string>& targets, const std::string& key) {
  for (const auto& t : targets)
    if (key == t || (key.size() > t.size() && key.ends_with("." + t))) return true;
  return false;
}

bool is_null_or_empty(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return true;
  return (j[key].is_array() || j[key].is_object() || j[key].is_string()) && j[key].empty();
}

}  // namespace

PeftAdapterConfig read_peft_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kConfig).string();
  std::ifstream in(path);
  DTR_CHECK(in.good(), "read_peft_config: cannot open ", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    DTR_ERROR(path, ": invalid JSON: ", e.what());
  }
  DTR_CHECK(j.is_object(), path, ": expected a JSON object");
  auto str = [&](const char* key, const std::string& def) {
    if (!j.contains(key) || j[key].is_null()) return def;
    DTR_CHECK(j[key].is_string(), path, ": key \"", key, "\" must be a string");
    return j[key].get<std::string>();
  };
  auto flag = [&](const char* key) {
    if (!j.contains(key) || j[key].is_null()) return false;
    DTR_CHECK(j[key].is_boolean(), path, ": key \"", key, "\" must be a boolean");
    return j[key].get<bool>();
  };
  DTR_CHECK(str("peft_type", "") == "LORA", path, ": peft_type must be \"LORA\", got \"", str("peft_type", ""), "\"");
  DTR_CHECK(str("bias", "none") == "none", path, ": bias \"", str("bias", ""), "\" is not supported (only \"none\")");
  DTR_CHECK(!flag("use_dora"), path, ": use_dora is not supported");
  DTR_CHECK(!flag("fan_in_fan_out"), path, ": fan_in_fan_out is not supported");
  for (const char* key : {"rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform"})
    DTR_CHECK(is_null_or_empty(j, key), path, ": key \"", key, "\" is not supported (must be empty or null)");
  PeftAdapterConfig c;
  DTR_CHECK(j.contains("r") && j["r"].is_number_integer(), path, ": key \"r\" missing or not an integer");
  c.r = j["r"].get<int64_t>();
  DTR_CHECK(c.r > 0, path, ": key \"r\" must be positive, got ", c.r);
  DTR_CHECK(j.contains("lora_alpha") && j["lora_alpha"].is_number(), path, ": key \"lora_alpha\" missing or not a number");
  c.lora_alpha = j["lora_alpha"].get<double>();
  if (j.contains("lora_dropout") && !j["lora_dropout"].is_null()) {
    DTR_CHECK(j["lora_dropout"].is_number(), path, ": key \"lora_dropout\" must be a number");
    c.lora_dropout = j["lora_dropout"].get<double>();
  }
  c.use_rslora = flag("use_rslora");
  c.base_model_name_or_path = str("base_model_name_or_path", "");
  if (j.contains("target_parameters") && !j["target_parameters"].is_null()) {
    const json& tp = j["target_parameters"];
    DTR_CHECK(tp.is_array(), path, ": key \"target_parameters\" must be a list of strings");
    for (const auto& e : tp) {
      DTR_CHECK(e.is_string(), path, ": key \"target_parameters\" must hold strings");
      c.target_parameters.push_back(e.get<std::string>());
    }
  }
  DTR_CHECK((j.contains("target_modules") && !j["target_modules"].is_null()) || !c.target_parameters.empty(), path,
            ": key \"target_modules\" missing");
  const json& t = j.contains("target_modules") && !j["target_modules"].is_null() ? j["target_modules"] : json::array();
  if (t.is_string()) {
    c.target_regex = t.get<std::string>();
  } else {
    DTR_CHECK(t.is_array(), path, ": key \"target_modules\" must be a list of strings or a string");
    for (const auto& e : t) {
      DTR_CHECK(e.is_string(), path, ": key \"target_modules\" must hold strings");
      c.target_modules.push_back(e.get<std::string>());
    }
  }
  return c;
}

void save_peft_adapter(nn::Module& model, const std::string& dir, const std::string& base_model) {
  const auto loras = lora_modules(model);
  std::vector<std::pair<std::string, std::shared_ptr<nn::GroupedExperts>>> experts, all_experts = grouped_experts(model);
  for (const auto& e : all_experts)
    if (e.second->has_lora()) experts.push_back(e);
  DTR_CHECK(!loras.empty() || !experts.empty(), "save_peft_adapter(", dir,
            "): the model has no LoRALinear modules and no experts with LoRA");
  const std::string first = loras.empty() ? experts.front().first : loras.front().first;
  const nn::LoraOptions o = loras.empty() ? experts.front().second->lora_options() : loras.front().second->options();
  auto check_same = [&](const std::string& fqn, const nn::LoraOptions& p) {
    DTR_CHECK(p.r == o.r && p.alpha == o.alpha && p.dropout == o.dropout && p.use_rslora == o.use_rslora,
              "save_peft_adapter: adapters differ (", first, ": r ", o.r, " alpha ", o.alpha, " vs ", fqn, ": r ", p.r,
              " alpha ", p.alpha, "); per-module rank_pattern is not supported");
  };
  safetensors::TensorMap tensors;
  std::set<std::string> leaves, adapted;
  // Experts: PEFT's target_parameters (ParamWrapper) layout; all of them adapted -> the short
  // names, else each block's full parameter names.
  json target_parameters = json::array();
  for (const auto& [fqn, e] : experts) {
    check_same(fqn, e->lora_options());
    for (auto& [k, t] : peft_expert_lora_tensors(fqn, *e)) tensors[kPrefix + k] = t;
    if (experts.size() != all_experts.size())
      for (const char* p : {"gate_up_proj", "down_proj"}) target_parameters.push_back(fqn + "." + p);
  }
  if (!experts.empty() && experts.size() == all_experts.size())
    target_parameters = {leaf_name(experts.front().first) + ".gate_up_proj", leaf_name(experts.front().first) + ".down_proj"};
  for (const auto& [fqn, l] : loras) {
    check_same(fqn, l->options());
    tensors[kPrefix + fqn + ".lora_A.weight"] = l->lora_A()->weight().detach();
    tensors[kPrefix + fqn + ".lora_B.weight"] = l->lora_B()->weight().detach();
    leaves.insert(leaf_name(fqn));
    adapted.insert(fqn);
  }
  // Short names are PEFT's usual form; use them when they select exactly the adapted modules.
  const std::vector<std::string> names(leaves.begin(), leaves.end());
  std::set<std::string> selected;
  const ModuleMatcher short_names = ModuleMatcher::list(names, "save_peft_adapter(" + dir + ")");
  for (const auto& fqn : linear_fqns(model))
    if (short_names.matches(fqn)) selected.insert(fqn);
  json targets;
  if (adapted.empty()) {
    targets = json::array();
  } else if (selected == adapted) {
    targets = names;
  } else {
    std::string re;
    for (const auto& fqn : adapted) re += (re.empty() ? "" : "|") + regex_escape(fqn);
    targets = "(" + re + ")";
  }
  const bool int_alpha = o.alpha == static_cast<double>(static_cast<int64_t>(o.alpha));
  json cfg = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", o.r},
      {"lora_alpha", int_alpha ? json(static_cast<int64_t>(o.alpha)) : json(o.alpha)},
      {"lora_dropout", o.dropout},
      {"target_modules", targets},
      {"bias", "none"},
      {"base_model_name_or_path", base_model.empty() ? json(nullptr) : json(base_model)},
      {"use_rslora", o.use_rslora},
      {"use_dora", false},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
      {"revision", nullptr},
  };
  if (!experts.empty()) cfg["target_parameters"] = target_parameters;
  std::filesystem::create_directories(dir);
  safetensors::save_file(tensors, (std::filesystem::path(dir) / kWeights).string(), {{"format", "pt"}});
  const std::string text = cfg.dump(2) + "\n";
  AtomicFileWriter w((std::filesystem::path(dir) / kConfig).string());
  w.write(text.data(), text.size());
  w.commit();
}

std::vector<std::string> load_peft_adapter(nn::Module& model, const std::string& dir) {
  const PeftAdapterConfig c = read_peft_config(dir);
  const std::string wpath = (std::filesystem::path(dir) / kWeights).string();
  DTR_CHECK(lora_modules(model).empty(), "load_peft_adapter(", dir, "): the model already has LoRA modules");
  std::vector<std::string> targets;
  const std::string where = (std::filesystem::path(dir) / kConfig).string();
  const ModuleMatcher matcher = c.target_regex.empty() ? ModuleMatcher::list(c.target_modules, where)
                                                       : ModuleMatcher::regex(c.target_regex, where);
  for (const auto& fqn : linear_fqns(model))
    if (!c.target_modules.empty() || !c.target_regex.empty())
      if (matcher.matches(fqn)) targets.push_back(fqn);
  // target_parameters: dtr adapts an experts module's gate_up_proj and down_proj together.
  std::vector<std::string> expert_targets;
  for (const auto& [fqn, e] : grouped_experts(model)) {
    const bool gu = peft_parameter_targeted(c.target_parameters, fqn + ".gate_up_proj");
    const bool dn = peft_parameter_targeted(c.target_parameters, fqn + ".down_proj");
    DTR_CHECK(gu == dn, where, ": target_parameters adapts only ", gu ? "gate_up_proj" : "down_proj", " of ", fqn,
              " (LoRA on one expert projection alone is not built; dtr adapts both)");
    if (gu) expert_targets.push_back(fqn);
  }
  DTR_CHECK(!targets.empty() || !expert_targets.empty(), dir, "/", kConfig,
            ": target_modules selects no Linear module of the model",
            c.target_parameters.empty() ? "" : " (and target_parameters no experts parameter)");

  const safetensors::TensorMap sd = safetensors::load_file(wpath);
  std::set<std::string> targeted(targets.begin(), targets.end());
  targeted.insert(expert_targets.begin(), expert_targets.end());
  for (const auto& [key, t] : sd) {
    DTR_CHECK(key.starts_with(kPrefix) && is_lora_parameter(key), wpath, ": unexpected key \"", key,
              "\" (expected base_model.model.<fqn>.lora_A.weight / lora_B.weight)");
    std::string fqn = key.substr(std::string(kPrefix).size(), key.size() - std::string(kPrefix).size() - 14);
    if (fqn.ends_with(".base_layer") && !targeted.count(fqn)) fqn.resize(fqn.size() - 11);  // experts' inner wrapper
    DTR_CHECK(targeted.count(fqn), wpath, ": key \"", key, "\" names module \"", fqn,
              "\", which target_modules of adapter_config.json does not select");
  }

  LoraConfig lc;
  lc.target_modules = targets;  // exact FQNs
  lc.target_modules.insert(lc.target_modules.end(), expert_targets.begin(), expert_targets.end());
  lc.options.r = c.r;
  lc.options.alpha = c.lora_alpha;
  lc.options.dropout = c.lora_dropout;
  lc.options.dropout_position = nn::LoraDropoutPosition::pre;  // PEFT applies dropout to the input
  lc.options.use_rslora = c.use_rslora;
  const std::vector<std::string> adapted = apply_lora(model, lc);

  NoGradGuard ng;
  for (const auto& [fqn, l] : lora_modules(model)) {
    for (const char* ab : {"lora_A", "lora_B"}) {
      const std::string key = kPrefix + fqn + "." + ab + ".weight";
      auto it = sd.find(key);
      DTR_CHECK(it != sd.end(), wpath, ": missing key \"", key, "\"");
      Tensor w = std::string(ab) == "lora_A" ? l->lora_A()->weight() : l->lora_B()->weight();
      DTR_CHECK(it->second.sizes() == w.sizes(), wpath, ": key \"", key, "\" has shape ", it->second.sizes(),
                ", the model expects ", w.sizes(), " (r = ", c.r, ")");
      w.copy_(it->second.dtype() == w.dtype() ? it->second : to_dtype(it->second, w.dtype()));
    }
  }
  for (const auto& [fqn, e] : grouped_experts(model))
    if (e->has_lora()) load_peft_expert_lora(kPrefix + fqn, sd, *e);
  return adapted;
}

void save_merged_model(CausalLM& model, const std::string& dir) { save_model_hf(model, dir); }

}  // namespace dtr
