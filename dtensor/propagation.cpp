#include "dtensor/propagation.h"

#include <limits>
#include <map>
#include <mutex>

#include "dtensor/redistribute.h"

namespace dtr {
namespace {
std::map<std::string, RuleEntry>& rules() {
  static std::map<std::string, RuleEntry> r;
  return r;
}
}  // namespace

void register_sharding_rule(const std::string& name, ShardingRule rule, StridedInputs strided) {
  rules()[name] = RuleEntry{std::move(rule), strided};
}

const RuleEntry* find_sharding_rule(const std::string& name) {
  auto it = rules().find(name);
  return it == rules().end() ? nullptr : &it->second;
}

DTensorSpec without_strided(const DTensorSpec& s) {
  DTensorSpec out = s;
  for (auto& p : out.placements)
    if (p.is_strided_shard()) p = Replicate();
  return out;
}

double redistribute_cost(const DTensorSpec& from, const Placements& to) {
  if (from.placements == to) return 0.0;
  for (size_t i = 0; i < to.size(); ++i)  // infeasible: a shard cannot become Partial
    if (from.placements[i].shards() && to[i].is_partial()) return std::numeric_limits<double>::infinity();
  double bytes = static_cast<double>(itemsize(from.dtype));
  for (int64_t s : from.shape) bytes *= static_cast<double>(s);
  double cost = 0.0;
  Placements cur = from.placements;
  auto shards = [&](const Placements& p) {
    double n = 1;
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i].shards()) n *= static_cast<double>(from.mesh.size(static_cast<int>(i)));
    return n;
  };
  for (const auto& st : plan_redistribute(from, to)) {
    cost += st.transition->cost(bytes / shards(cur), static_cast<double>(from.mesh.size(st.mesh_dim)));
    cur[st.mesh_dim] = st.to;
  }
  return cost;
}

const Strategy& choose_strategy(const OpSchema& s, const std::vector<Strategy>& candidates) {
  DTR_CHECK(!candidates.empty(), s.call.name(), ": no sharding strategy for these inputs");
  const Strategy* best = nullptr;
  double best_cost = 0;
  for (const auto& c : candidates) {
    double cost = 0;
    for (size_t i = 0; i < c.inputs.size() && i < s.specs.size(); ++i)
      if (s.specs[i] && !c.inputs[i].empty()) cost += redistribute_cost(*s.specs[i], c.inputs[i]);
    if (cost == std::numeric_limits<double>::infinity()) continue;
    if (!best || cost < best_cost) {
      best = &c;
      best_cost = cost;
    }
  }
  DTR_CHECK(best != nullptr, s.call.name(), ": no feasible sharding strategy for these inputs");
  return *best;
}

std::vector<Strategy> expand_strategies(const std::vector<std::vector<DimOption>>& per_dim, size_t n_in,
                                        size_t n_out) {
  std::vector<Strategy> out{Strategy{std::vector<Placements>(n_in), std::vector<Placements>(n_out)}};
  for (const auto& options : per_dim) {
    std::vector<Strategy> next;
    for (const auto& s : out)
      for (const auto& o : options) {
        Strategy t = s;
        for (size_t i = 0; i < n_in; ++i) t.inputs[i].push_back(o.inputs[i]);
        for (size_t i = 0; i < n_out; ++i) t.outputs[i].push_back(o.outputs[i]);
        next.push_back(std::move(t));
      }
    out = std::move(next);
  }
  return out;
}

}  // namespace dtr
