#include "parallel/parallel_dims.h"

#include <sstream>

#include "tensor/error.h"

namespace dtr {
namespace {

/// "tp_size*cp_size*pp_size" (names) or "2*1*1" (degrees) of `dims`.
std::string joined(const std::vector<ParallelDims::Dim>& dims, bool names) {
  std::string s;
  for (const auto& [name, v] : dims) s += (s.empty() ? "" : "*") + (names ? name + "_size" : std::to_string(v));
  return s;
}

/// Product of the degrees; false when it overflows int64.
bool product(const std::vector<ParallelDims::Dim>& dims, int64_t& out) {
  out = 1;
  for (const auto& d : dims)
    if (__builtin_mul_overflow(out, d.second, &out)) return false;
  return true;
}

/// Every degree given in the recipe is >= 1 (dp_size is checked by validate).
void check_degrees(const ParallelDims& p, const std::string& where) {
  std::vector<ParallelDims::Dim> all = p.model_parallel_dims();
  all.push_back({"ep", p.ep_size});
  all.push_back({"dp_replicate", p.dp_replicate_size});
  for (const auto& [name, v] : all) DTR_CHECK(v >= 1, where, ".", name, "_size=", v, ": must be >= 1");
}

}  // namespace

std::vector<ParallelDims::Dim> ParallelDims::mesh_dims() const {
  return {{"pp", pp_size}, {"dp_replicate", dp_replicate_size}, {"dp_shard", dp_shard_size()}, {"cp", cp_size},
          {"tp", tp_size}};
}

std::vector<ParallelDims::Dim> ParallelDims::model_parallel_dims() const {
  return {{"tp", tp_size}, {"cp", cp_size}, {"pp", pp_size}};
}

void ParallelDims::infer_dp_size(const std::string& where) {
  check_degrees(*this, where);
  const auto mp = model_parallel_dims();
  int64_t model_par = 1;
  DTR_CHECK(product(mp, model_par), where, ": ", joined(mp, true), " = ", joined(mp, false),
            " overflows int64 (world size ", world_size, ")");
  std::string each;
  for (const auto& [name, v] : mp) each += (each.empty() ? "" : ", ") + name + "_size=" + std::to_string(v);
  DTR_CHECK(world_size % model_par == 0, where, ": world size ", world_size, " is not divisible by ", joined(mp, true),
            "=", model_par, " (", each, ")");
  dp_size = world_size / model_par;
}

void ParallelDims::validate(const std::string& where) const {
  check_degrees(*this, where);
  DTR_CHECK(dp_size >= 1, where, ".dp_size=", dp_size, ": must be >= 1");
  std::vector<Dim> all = model_parallel_dims();
  all.insert(all.begin(), {"dp", dp_size});
  int64_t prod = 1;
  DTR_CHECK(product(all, prod), where, ": ", joined(all, true), " = ", joined(all, false), " overflows int64 (world size ",
            world_size, ")");
  DTR_CHECK(prod == world_size, where, ": ", joined(all, true), " = ", joined(all, false), " = ", prod,
            " != world size ", world_size);
  DTR_CHECK(dp_size % dp_replicate_size == 0, where, ".dp_replicate_size=", dp_replicate_size,
            " does not divide dp_size=", dp_size);
  DTR_CHECK(!(pp_size > 1 && (ep_size > 1 || cp_size > 1)), where, ".pp_size=", pp_size,
            " with ep_size / cp_size > 1: pipeline parallelism with expert or context parallelism is not built in dtr");
  DTR_CHECK(!(ep_size > 1 && cp_size > 1), where, ".ep_size=", ep_size, " with cp_size=", cp_size,
            ": expert parallelism with context parallelism is not built in dtr");
  // Expert parallelism carves ep out of the data-parallel shard ranks (Automodel's MoE mesh):
  // dp_shard_cp = ep_shard x ep, ep fastest.
  DTR_CHECK(dp_shard_cp_size() % ep_size == 0, where, ".ep_size=", ep_size,
            " does not divide dp_shard_cp = dp_size/dp_replicate_size*cp_size = ", dp_shard_cp_size(),
            " (experts are sharded over data-parallel ranks)");
}

void ParallelDims::build_mesh(Device device) {
  Shape sizes;
  std::vector<std::string> names;
  for (const auto& [name, v] : mesh_dims()) {
    names.push_back(name);
    sizes.push_back(v);
  }
  mesh = std::make_shared<DeviceMesh>(sizes, names, device);
  mesh->flatten({"dp_replicate", "dp_shard"}, "dp");
  mesh->flatten({"dp_shard", "cp"}, "dp_shard_cp");
  mesh->flatten({"dp_replicate", "dp_shard", "cp"}, "dp_cp");
  if (ep_size > 1)  // cp is 1 with ep (validate), so dp_shard_cp = dp_shard = ep_shard x ep in the same rank order
    moe_mesh = std::make_shared<DeviceMesh>(Shape{pp_size, dp_replicate_size, ep_shard_size(), ep_size, tp_size},
                                            std::vector<std::string>{"pp", "dp_replicate", "ep_shard", "ep", "tp"},
                                            mesh->device());
}

namespace {
const DeviceMesh& built(const std::shared_ptr<DeviceMesh>& m) {
  DTR_CHECK(m != nullptr, "ParallelDims: build_mesh() was not called");
  return *m;
}
}  // namespace

DeviceMesh ParallelDims::ep_mesh() const {
  DTR_CHECK(moe_mesh != nullptr, "ParallelDims: no MoE mesh (ep_size=", ep_size,
            "; build_mesh() builds it for ep_size > 1)");
  return (*moe_mesh)["ep"];
}

DeviceMesh ParallelDims::expert_fsdp_mesh() const {
  DTR_CHECK(moe_mesh != nullptr, "ParallelDims: no MoE mesh (ep_size=", ep_size,
            "; build_mesh() builds it for ep_size > 1)");
  if (dp_replicate_size > 1) return (*moe_mesh)[std::vector<std::string>{"dp_replicate", "ep_shard", "ep"}];
  return (*moe_mesh)[std::vector<std::string>{"ep_shard", "ep"}];
}

DeviceMesh ParallelDims::tp_mesh() const { return built(mesh)["tp"]; }

DeviceMesh ParallelDims::cp_mesh() const { return built(mesh)["cp"]; }

DeviceMesh ParallelDims::dp_cp_mesh() const { return built(mesh)["dp_cp"]; }

DeviceMesh ParallelDims::dp_mesh() const { return built(mesh)["dp"]; }

DeviceMesh ParallelDims::fsdp_mesh() const {
  if (dp_replicate_size > 1) return built(mesh)[std::vector<std::string>{"dp_replicate", "dp_shard_cp"}];
  return built(mesh)["dp_shard_cp"];
}

DeviceMesh ParallelDims::fsdp_tp_mesh() const {
  if (dp_replicate_size > 1) return built(mesh)[std::vector<std::string>{"dp_replicate", "dp_shard_cp", "tp"}];
  return built(mesh)[std::vector<std::string>{"dp_shard_cp", "tp"}];
}

int64_t ParallelDims::dp_rank() const { return dp_mesh().coordinate(0); }

std::string ParallelDims::str() const {
  std::ostringstream os;
  os << "world=" << world_size << " dp=" << dp_size << " (replicate " << dp_replicate_size << " x shard "
     << dp_shard_size() << ") tp=" << tp_size;
  if (cp_size > 1) os << " cp=" << cp_size;
  if (pp_size > 1) os << " pp=" << pp_size;
  if (ep_size > 1) os << " ep=" << ep_size << " (ep_shard " << ep_shard_size() << ")";
  return os.str();
}

}  // namespace dtr
