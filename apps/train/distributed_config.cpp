#include "apps/train/distributed_config.h"

#include <yaml-cpp/yaml.h>

#include <functional>
#include <utility>
#include <vector>

#include "parallel/tensor_parallel/plan_from_names.h"
#include "tensor/error.h"

namespace dtr::train {
namespace {
int64_t get_int(const YAML::Node& n, const std::string& key, const std::string& where) {
  try {
    return n.as<int64_t>();
  } catch (...) {
    DTR_ERROR(where, ".", key, ": expected an integer, got '", YAML::Dump(n), "'");
  }
}

bool get_bool(const YAML::Node& n, const std::string& key, const std::string& where) {
  try {
    return n.as<bool>();
  } catch (...) {
    DTR_ERROR(where, ".", key, ": expected true or false, got '", YAML::Dump(n), "'");
  }
}

std::string get_str(const YAML::Node& n, const std::string& key, const std::string& where) {
  DTR_CHECK(n.IsScalar(), where, ".", key, ": expected a string, got '", YAML::Dump(n), "'");
  return n.as<std::string>();
}

std::optional<DType> get_dtype(const YAML::Node& n, const std::string& key, const std::string& where) {
  const std::string s = get_str(n, key, where);
  if (s == "null" || s.empty()) return std::nullopt;
  try {
    return dtype_from_name(s);
  } catch (const Error& e) {
    DTR_ERROR(where, ".", key, ": ", e.what());
  }
}

/// offload_policy: null / false (off), true, or a map with `_target_` (a CPUOffloadPolicy /
/// OffloadPolicy class path, as Automodel recipes write it) and `pin_memory`.
OffloadPolicy get_offload_policy(const YAML::Node& v, const std::string& where) {
  OffloadPolicy o;
  if (v.IsNull()) return o;
  if (v.IsScalar()) {
    o.enabled = get_bool(v, "offload_policy", where);
    return o;
  }
  DTR_CHECK(v.IsMap(), where, ".offload_policy: expected true, false or a map (_target_, pin_memory)");
  o.enabled = true;
  for (const auto& kv : v) {
    const std::string k = kv.first.as<std::string>();
    const std::string full = "offload_policy." + k;
    if (k == "pin_memory") {
      o.pin_memory = get_bool(kv.second, full, where);
    } else if (k == "_target_") {
      const std::string t = get_str(kv.second, full, where);
      DTR_CHECK(t.ends_with("CPUOffloadPolicy") || t.ends_with(".OffloadPolicy") || t == "OffloadPolicy", where, ".",
                full, "='", t, "': expected torch.distributed.fsdp.CPUOffloadPolicy (or OffloadPolicy)");
      o.enabled = t.ends_with("CPUOffloadPolicy");  // torch's base OffloadPolicy means no offload
    } else {
      DTR_ERROR(where, ".offload_policy: unknown key '", k, "' (expected _target_, pin_memory)");
    }
  }
  return o;
}

/// The integer degrees, by recipe key (dp_size apart: null there means "derive").
const std::vector<std::pair<const char*, int64_t ParallelDims::*>>& degree_keys() {
  static const std::vector<std::pair<const char*, int64_t ParallelDims::*>> k{
      {"dp_replicate_size", &ParallelDims::dp_replicate_size},
      {"tp_size", &ParallelDims::tp_size},
      {"cp_size", &ParallelDims::cp_size},
      {"pp_size", &ParallelDims::pp_size},
      {"ep_size", &ParallelDims::ep_size}};
  return k;
}

DataParallelStrategy get_strategy(const YAML::Node& v, const std::string& where) {
  const std::string s = get_str(v, "strategy", where);
  if (s == "fsdp2") return DataParallelStrategy::fsdp2;
  if (s == "ddp") return DataParallelStrategy::ddp;
  DTR_ERROR(where, ".strategy='", s, "': expected fsdp2 or ddp (megatron_fsdp is not built in dtr)");
}

std::optional<CheckpointPolicy> get_activation_checkpointing(const YAML::Node& v, const std::string& where) {
  const std::string s = get_str(v, "activation_checkpointing", where);
  if (s == "true" || s == "full") return CheckpointPolicy::full;
  if (s == "false" || s == "none") return std::nullopt;
  if (s == "selective") return CheckpointPolicy::selective;
  DTR_ERROR(where, ".activation_checkpointing: expected true, false, full or selective, got '", s, "'");
}

MixedPrecisionPolicy get_mp_policy(const YAML::Node& v, const std::string& where) {
  MixedPrecisionPolicy m;
  if (v.IsNull()) return m;
  DTR_CHECK(v.IsMap(), where, ".mp_policy: expected a map (param_dtype, reduce_dtype, output_dtype)");
  for (const auto& p : v) {
    const std::string pk = p.first.as<std::string>();
    const std::string full = "mp_policy." + pk;
    if (pk == "param_dtype") m.param_dtype = get_dtype(p.second, full, where);
    else if (pk == "reduce_dtype") m.reduce_dtype = get_dtype(p.second, full, where);
    else if (pk == "output_dtype") m.output_dtype = get_dtype(p.second, full, where);
    else if (pk == "cast_forward_inputs") m.cast_forward_inputs = get_bool(p.second, full, where);
    else
      DTR_ERROR(where, ".mp_policy: unknown key '", pk,
                "' (expected param_dtype, reduce_dtype, output_dtype, cast_forward_inputs)");
  }
  return m;
}

}  // namespace

MeshContext parse_distributed(const YAML::Node& d, int64_t world,
                              const std::function<std::string(const std::string&)>& where_of) {
  const std::string section = where_of("");  // errors about the section as a whole
  MeshContext c;
  c.world_size = world;
  bool dp_given = false;
  if (d && !d.IsNull()) {
    DTR_CHECK(d.IsMap(), section, ": expected a map of settings");
    for (const auto& kv : d) {
      const std::string k = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      const std::string where = where_of(k);  // errors about this key
      bool degree = false;
      for (const auto& [key, field] : degree_keys())
        if (k == key) {
          c.*field = get_int(v, k, where);
          degree = true;
        }
      if (degree) continue;
      if (k == "strategy") c.strategy = get_strategy(v, where);
      else if (k == "dp_size") {
        if (!v.IsNull()) {
          c.dp_size = get_int(v, k, where);
          dp_given = true;
        }
      } else if (k == "sequence_parallel") c.sequence_parallel = get_bool(v, k, where);
      else if (k == "pipeline") c.pipeline = parse_pipeline_config(v, where);
      else if (k == "activation_checkpointing") c.activation_checkpointing = get_activation_checkpointing(v, where);
      else if (k == "activation_checkpointing_scope") c.activation_checkpointing_scope = get_str(v, k, where);
      else if (k == "mp_policy") c.mp_policy = get_mp_policy(v, where);
      else if (k == "offload_policy") c.offload_policy = get_offload_policy(v, where);
      else if (k == "reshard_after_forward") {
        if (!v.IsNull()) c.reshard_after_forward = get_bool(v, k, where);
      } else if (k == "enable_fsdp2_prefetch") c.enable_fsdp2_prefetch = get_bool(v, k, where);
      else if (k == "fsdp2_forward_prefetch_depth") c.fsdp2_forward_prefetch_depth = static_cast<int>(get_int(v, k, where));
      else if (k == "fsdp2_backward_prefetch_depth") c.fsdp2_backward_prefetch_depth = static_cast<int>(get_int(v, k, where));
      else if (k == "defer_fsdp_grad_sync") c.defer_fsdp_grad_sync = get_bool(v, k, where);
      else if (k == "tp_plan") {
        if (v.IsNull()) continue;
        DTR_CHECK(v.IsMap(), where, ".tp_plan: expected a map of module-name pattern -> style (", tp_style_names(),
                  "), got '", YAML::Dump(v), "'");
        for (const auto& p : v) {
          const std::string pattern = p.first.as<std::string>(), full = "tp_plan." + pattern;
          const std::string style = get_str(p.second, full, where);
          (void)parallel_style_from_name(style, where + "." + full);  // a bad name fails when the recipe is read
          c.tp_plan.emplace_back(pattern, style);
        }
      }
      else if (k == "enable_async_tensor_parallel" || k == "enable_compile") {
        DTR_CHECK(!get_bool(v, k, where), where, ".", k, ": true is not supported by dtr (only false)");
      } else {
        DTR_ERROR(where, ": unknown key '", k,
                  "' (expected strategy, dp_size, dp_replicate_size, tp_size, cp_size, pp_size, pipeline, ep_size, "
                  "sequence_parallel, activation_checkpointing, activation_checkpointing_scope, mp_policy, "
                  "offload_policy, reshard_after_forward, enable_fsdp2_prefetch, fsdp2_forward_prefetch_depth, "
                  "fsdp2_backward_prefetch_depth, defer_fsdp_grad_sync, tp_plan)");
      }
    }
  }
  if (!dp_given) c.infer_dp_size(section);
  c.validate(section);
  return c;
}

MeshContext parse_distributed(const YAML::Node& d, int64_t world, const std::string& where) {
  return parse_distributed(d, world, [&](const std::string&) { return where; });
}

}  // namespace dtr::train
