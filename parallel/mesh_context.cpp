#include "parallel/mesh_context.h"

#include <yaml-cpp/yaml.h>

#include "parallel/tensor_parallel/plan_from_names.h"

#include <set>
#include <sstream>

namespace dtr {
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

}  // namespace

MeshContext MeshContext::from_yaml(const YAML::Node& d, int64_t world, const std::string& where) {
  MeshContext c;
  c.world_size = world;
  bool dp_given = false;
  if (d && !d.IsNull()) {
    DTR_CHECK(d.IsMap(), where, ": expected a map of settings");
    for (const auto& kv : d) {
      const std::string k = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (k == "strategy") c.strategy = get_str(v, k, where);
      else if (k == "dp_size") {
        if (!v.IsNull()) {
          c.dp_size = get_int(v, k, where);
          dp_given = true;
        }
      } else if (k == "dp_replicate_size") c.dp_replicate_size = get_int(v, k, where);
      else if (k == "tp_size") c.tp_size = get_int(v, k, where);
      else if (k == "cp_size") c.cp_size = get_int(v, k, where);
      else if (k == "pp_size") c.pp_size = get_int(v, k, where);
      else if (k == "ep_size") c.ep_size = get_int(v, k, where);
      else if (k == "sequence_parallel") c.sequence_parallel = get_bool(v, k, where);
      else if (k == "activation_checkpointing") {
        const std::string s = get_str(v, k, where);
        if (s == "true" || s == "full") c.activation_checkpointing = "full";
        else if (s == "false" || s == "none") c.activation_checkpointing = "none";
        else if (s == "selective") c.activation_checkpointing = "selective";
        else DTR_ERROR(where, ".activation_checkpointing: expected true, false, full or selective, got '", s, "'");
      } else if (k == "activation_checkpointing_scope") c.activation_checkpointing_scope = get_str(v, k, where);
      else if (k == "mp_policy") {
        if (v.IsNull()) continue;
        DTR_CHECK(v.IsMap(), where, ".mp_policy: expected a map (param_dtype, reduce_dtype, output_dtype)");
        for (const auto& p : v) {
          const std::string pk = p.first.as<std::string>();
          const std::string full = "mp_policy." + pk;
          if (pk == "param_dtype") c.mp_policy.param_dtype = get_dtype(p.second, full, where);
          else if (pk == "reduce_dtype") c.mp_policy.reduce_dtype = get_dtype(p.second, full, where);
          else if (pk == "output_dtype") c.mp_policy.output_dtype = get_dtype(p.second, full, where);
          else if (pk == "cast_forward_inputs") c.mp_policy.cast_forward_inputs = get_bool(p.second, full, where);
          else DTR_ERROR(where, ".mp_policy: unknown key '", pk, "' (expected param_dtype, reduce_dtype, output_dtype, cast_forward_inputs)");
        }
      } else if (k == "offload_policy") c.offload_policy = get_offload_policy(v, where);
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
                  "' (expected strategy, dp_size, dp_replicate_size, tp_size, cp_size, pp_size, ep_size, "
                  "sequence_parallel, activation_checkpointing, activation_checkpointing_scope, mp_policy, "
                  "offload_policy, reshard_after_forward, enable_fsdp2_prefetch, fsdp2_forward_prefetch_depth, "
                  "fsdp2_backward_prefetch_depth, defer_fsdp_grad_sync, tp_plan)");
      }
    }
  }
  for (auto [name, v] : {std::pair<const char*, int64_t>{"tp_size", c.tp_size}, {"cp_size", c.cp_size},
                         {"pp_size", c.pp_size}, {"ep_size", c.ep_size}, {"dp_replicate_size", c.dp_replicate_size}})
    DTR_CHECK(v >= 1, where, ".", name, "=", v, ": must be >= 1");
  int64_t model_par = 1;
  for (int64_t v : {c.tp_size, c.cp_size, c.pp_size})
    DTR_CHECK(!__builtin_mul_overflow(model_par, v, &model_par), where, ": tp_size*cp_size*pp_size = ", c.tp_size, "*",
              c.cp_size, "*", c.pp_size, " overflows int64 (world size ", world, ")");
  if (!dp_given) {
    DTR_CHECK(world % model_par == 0, where, ": world size ", world, " is not divisible by tp_size*cp_size*pp_size=",
              model_par, " (tp_size=", c.tp_size, ", cp_size=", c.cp_size, ", pp_size=", c.pp_size, ")");
    c.dp_size = world / model_par;
  }
  c.validate(where);
  return c;
}

void MeshContext::validate(const std::string& where) const {
  DTR_CHECK(strategy == "fsdp2" || strategy == "ddp", where, ".strategy='", strategy,
            "': expected fsdp2 or ddp (megatron_fsdp is not built in dtr)");
  DTR_CHECK(dp_size >= 1, where, ".dp_size=", dp_size, ": must be >= 1");
  int64_t prod = 1;
  bool overflow = false;
  for (int64_t v : {dp_size, tp_size, cp_size, pp_size}) overflow = overflow || __builtin_mul_overflow(prod, v, &prod);
  DTR_CHECK(!overflow, where, ": dp_size*tp_size*cp_size*pp_size = ", dp_size, "*", tp_size, "*", cp_size, "*",
            pp_size, " overflows int64 (world size ", world_size, ")");
  DTR_CHECK(prod == world_size, where, ": dp_size*tp_size*cp_size*pp_size = ", dp_size, "*", tp_size, "*", cp_size,
            "*", pp_size, " = ", prod, " != world size ", world_size);
  DTR_CHECK(dp_size % dp_replicate_size == 0, where, ".dp_replicate_size=", dp_replicate_size,
            " does not divide dp_size=", dp_size);
  DTR_CHECK(pp_size == 1, where, ".pp_size=", pp_size, ": pipeline parallelism is not built in dtr yet (use 1)");
  DTR_CHECK(!(strategy == "ddp" && cp_size > 1), where, ".strategy=ddp does not support cp_size=", cp_size,
            " (context parallelism shards FSDP over dp_shard_cp: use fsdp2)");
  DTR_CHECK(!(ep_size > 1 && cp_size > 1), where, ".ep_size=", ep_size, " with cp_size=", cp_size,
            ": expert parallelism with context parallelism is not built in dtr");
  // Expert parallelism carves ep out of the data-parallel shard ranks (Automodel's MoE mesh):
  // dp_shard_cp = ep_shard x ep, ep fastest.
  DTR_CHECK(ep_size == 1 || (dp_size / dp_replicate_size * cp_size) % ep_size == 0, where, ".ep_size=", ep_size,
            " does not divide dp_shard_cp = dp_size/dp_replicate_size*cp_size = ", dp_size / dp_replicate_size * cp_size,
            " (experts are sharded over data-parallel ranks)");
  DTR_CHECK(!(strategy == "ddp" && ep_size > 1), where, ".strategy=ddp does not support ep_size=", ep_size,
            " (use fsdp2)");
  DTR_CHECK(!(ep_size > 1 && sequence_parallel), where, ".ep_size=", ep_size,
            " with sequence_parallel=true is not built in dtr (the MoE block needs whole sequences on each tp rank)");
  DTR_CHECK(!(strategy == "ddp" && (tp_size > 1 || dp_replicate_size > 1)), where,
            ".strategy=ddp needs tp_size=1 and dp_replicate_size=1 (got tp_size=", tp_size, ", dp_replicate_size=",
            dp_replicate_size, ")");
  DTR_CHECK(!(strategy == "ddp" && mp_policy.any_dtype()), where,
            ".mp_policy: mixed precision is applied by FSDP; strategy=ddp does not support it (use strategy fsdp2)");
  DTR_CHECK(!(strategy == "ddp" && offload_policy.enabled), where,
            ".offload_policy: CPU offload is an FSDP policy; strategy=ddp does not support it (use strategy fsdp2)");
  DTR_CHECK(fsdp2_forward_prefetch_depth >= 0 && fsdp2_backward_prefetch_depth >= 0, where,
            ": prefetch depths must be >= 0 (got ", fsdp2_forward_prefetch_depth, ", ", fsdp2_backward_prefetch_depth,
            ")");
}

void MeshContext::build_mesh() {
  dp_shard_size = dp_size / dp_replicate_size;
  mesh = std::make_shared<DeviceMesh>(Shape{pp_size, dp_replicate_size, dp_shard_size, cp_size, tp_size},
                                      std::vector<std::string>{"pp", "dp_replicate", "dp_shard", "cp", "tp"});
  mesh->flatten({"dp_replicate", "dp_shard"}, "dp");
  mesh->flatten({"dp_shard", "cp"}, "dp_shard_cp");
  mesh->flatten({"dp_replicate", "dp_shard", "cp"}, "dp_cp");
  if (ep_size > 1)  // cp is 1 (validate), so dp_shard_cp = dp_shard = ep_shard x ep in the same rank order
    moe_mesh = std::make_shared<DeviceMesh>(
        Shape{pp_size, dp_replicate_size, dp_shard_size * cp_size / ep_size, ep_size, tp_size},
        std::vector<std::string>{"pp", "dp_replicate", "ep_shard", "ep", "tp"}, mesh->device());
}

DeviceMesh MeshContext::ep_mesh() const {
  DTR_CHECK(moe_mesh != nullptr, "MeshContext: no MoE mesh (ep_size=", ep_size, "; build_mesh() builds it for ep_size > 1)");
  return (*moe_mesh)["ep"];
}

DeviceMesh MeshContext::expert_fsdp_mesh() const {
  DTR_CHECK(moe_mesh != nullptr, "MeshContext: no MoE mesh (ep_size=", ep_size, "; build_mesh() builds it for ep_size > 1)");
  if (dp_replicate_size > 1) return (*moe_mesh)[std::vector<std::string>{"dp_replicate", "ep_shard", "ep"}];
  return (*moe_mesh)[std::vector<std::string>{"ep_shard", "ep"}];
}

DeviceMesh MeshContext::tp_mesh() const {
  DTR_CHECK(mesh != nullptr, "MeshContext: build_mesh() was not called");
  return (*mesh)["tp"];
}

DeviceMesh MeshContext::cp_mesh() const {
  DTR_CHECK(mesh != nullptr, "MeshContext: build_mesh() was not called");
  return (*mesh)["cp"];
}

DeviceMesh MeshContext::dp_cp_mesh() const {
  DTR_CHECK(mesh != nullptr, "MeshContext: build_mesh() was not called");
  return (*mesh)["dp_cp"];
}

DeviceMesh MeshContext::dp_mesh() const {
  DTR_CHECK(mesh != nullptr, "MeshContext: build_mesh() was not called");
  return (*mesh)["dp"];
}

DeviceMesh MeshContext::fsdp_mesh() const {
  DTR_CHECK(mesh != nullptr, "MeshContext: build_mesh() was not called");
  if (dp_replicate_size > 1) return (*mesh)[std::vector<std::string>{"dp_replicate", "dp_shard_cp"}];
  return (*mesh)["dp_shard_cp"];
}

DeviceMesh MeshContext::fsdp_tp_mesh() const {
  DTR_CHECK(mesh != nullptr, "MeshContext: build_mesh() was not called");
  if (dp_replicate_size > 1) return (*mesh)[std::vector<std::string>{"dp_replicate", "dp_shard_cp", "tp"}];
  return (*mesh)[std::vector<std::string>{"dp_shard_cp", "tp"}];
}

int64_t MeshContext::dp_rank() const {
  DTR_CHECK(mesh != nullptr, "MeshContext: build_mesh() was not called");
  return dp_mesh().coordinate(0);
}

std::string MeshContext::str() const {
  std::ostringstream os;
  os << "strategy=" << strategy << " world=" << world_size << " dp=" << dp_size << " (replicate " << dp_replicate_size
     << " x shard " << dp_size / dp_replicate_size << ") tp=" << tp_size;
  if (cp_size > 1) os << " cp=" << cp_size;
  if (ep_size > 1) os << " ep=" << ep_size << " (ep_shard " << dp_size / dp_replicate_size * cp_size / ep_size << ")";
  os << " sequence_parallel="
     << (sequence_parallel ? "true" : "false") << " activation_checkpointing=" << activation_checkpointing;
  if (!tp_plan.empty()) os << " tp_plan=recipe (" << tp_plan.size() << " entries)";
  if (!defer_fsdp_grad_sync) os << " defer_fsdp_grad_sync=false (gradients reduced every micro-batch)";
  if (offload_policy.enabled)
    os << " offload_policy=cpu (CPU run: shards, gradients and optimizer state already in host memory)";
  return os.str();
}

}  // namespace dtr
