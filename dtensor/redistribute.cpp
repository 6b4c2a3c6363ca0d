#include "dtensor/redistribute.h"

#include <iostream>

#include "dtensor/comm_debug.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"

namespace dtr {
namespace {

void log_step(const DTensorSpec& s, const RedistributeStep& st) {
  std::cerr << "[dtensor] redistribute mesh dim " << st.mesh_dim << ": " << st.from.str() << " -> " << st.to.str()
            << " (" << st.transition->name << ") for " << s.str() << "\n";
}

/// The (mesh dim, placement) pairs that apply before mesh dim m on the tensor dim m shards, in
/// application order: m's chunk is the same in two placement lists when these agree.
std::vector<std::pair<int, Placement>> shard_prefix(const Placements& pl, const Shape& mesh_shape, int m) {
  std::vector<std::pair<int, Placement>> out;
  for (int j : application_order(pl, mesh_shape)) {
    if (j == m) break;
    if (shards_dim(pl[j], pl[m].dim)) out.emplace_back(j, pl[j]);
  }
  return out;
}

/// Appends the step of mesh dim i from cur[i] to `to` with its table entry; cur[i] becomes `to`.
/// `entry` is the entry already found, else it is looked up (every pair the planner asks for
/// has one: X -> Replicate from a shard, Replicate -> X, Partial -> Replicate / shard).
void push_step(std::vector<RedistributeStep>& steps, const DTensorSpec& from, Placements& cur, const Placements& target,
               int i, const Placement& to, const Transition* entry = nullptr) {
  if (!entry) entry = find_transition(TransitionStep{from, cur, target, i, to});
  DTR_CHECK(entry != nullptr, "redistribute: no transition ", cur[i].str(), " -> ", to.str(), " on mesh dim ", i,
            " (", from.str(), ")");
  steps.push_back({i, cur[i], to, entry});
  cur[i] = to;
}
}  // namespace

std::vector<RedistributeStep> plan_redistribute(const DTensorSpec& from, const Placements& to_in) {
  const int nd = from.mesh.ndim();
  DTR_CHECK(static_cast<int>(to_in.size()) == nd, "redistribute: ", to_in.size(), " placements ",
            placements_str(to_in), " for a ", nd, "-d mesh");
  const Placements to = normalize_placements(to_in, static_cast<int64_t>(from.shape.size()), "redistribute");
  const Shape& ms = from.mesh.shape();
  Placements cur = from.placements;
  for (int i = 0; i < nd; ++i)
    DTR_CHECK(!(cur[i].shards() && to[i].is_partial()), "redistribute: ", cur[i].str(), " -> ", to[i].str(),
              " is not supported (a shard cannot become a pending reduction); from ", placements_str(cur), " to ",
              placements_str(to));
  std::vector<RedistributeStep> steps;
  // Phase 1: in reverse application order, undo every shard that changes or whose prefix (the
  // shards applied before it on its tensor dim) changes. Dims applied after an undone one were
  // undone before it, so each gather sees its rank's chunk of one level. A shard target the
  // table reaches directly (all_to_all when nothing nested interferes) is taken at once.
  const std::vector<int> from_order = application_order(cur, ms);
  for (auto it = from_order.rbegin(); it != from_order.rend(); ++it) {
    const int i = *it;
    if (!cur[i].shards()) continue;
    if (cur[i] == to[i] && shard_prefix(cur, ms, i) == shard_prefix(to, ms, i)) continue;
    const Transition* direct = to[i].shards() ? find_transition(TransitionStep{from, cur, to, i, to[i]}) : nullptr;
    push_step(steps, from, cur, to, i, direct ? to[i] : Placement(Replicate()), direct);
  }
  // Phase 2: in the target's application order, apply the targets; a pair without an entry
  // (Partial -> another Partial op, Partial -> a lone strided shard) goes through Replicate.
  for (int i : application_order(to, ms)) {
    if (cur[i] == to[i]) continue;
    const Transition* direct = find_transition(TransitionStep{from, cur, to, i, to[i]});
    if (!direct) push_step(steps, from, cur, to, i, Replicate());
    push_step(steps, from, cur, to, i, to[i], direct);
  }
  return steps;
}

Tensor redistribute_local(const Tensor& local_in, const DTensorSpec& from, const Placements& to_in) {
  NoGradGuard no_grad;
  const auto steps = plan_redistribute(from, to_in);
  const Placements to = normalize_placements(to_in, static_cast<int64_t>(from.shape.size()), "redistribute");
  Placements cur = from.placements;
  Tensor local = local_in;
  for (const auto& st : steps) {
    if (dtensor_debug_enabled()) log_step(from, st);
    // A size-1 mesh dim: every transition is the identity.
    if (from.mesh.size(st.mesh_dim) > 1) local = st.transition->run(local, TransitionStep{from, cur, to, st.mesh_dim, st.to});
    cur[st.mesh_dim] = st.to;
  }
  return local;
}

std::vector<RedistributeComm> redistribute_comm(const DTensorSpec& from, const Placements& to_in) {
  const auto steps = plan_redistribute(from, to_in);
  const Placements to = normalize_placements(to_in, static_cast<int64_t>(from.shape.size()), "redistribute");
  Placements cur = from.placements;
  std::vector<RedistributeComm> out;
  for (const auto& st : steps) {
    const Transition& t = *st.transition;
    if (from.mesh.size(st.mesh_dim) > 1 && t.collective)
      out.push_back({st.mesh_dim, *t.collective, t.comm_bytes(TransitionStep{from, cur, to, st.mesh_dim, st.to})});
    cur[st.mesh_dim] = st.to;
  }
  return out;
}

Tensor redistribute(const Tensor& x, const Placements& placements) {
  const DTensorSpec& from = dtensor_spec(x, "redistribute");
  DTensorSpec to = from;
  DTR_CHECK(static_cast<int>(placements.size()) == from.mesh.ndim(), "redistribute: ", placements.size(),
            " placements ", placements_str(placements), " for a ", from.mesh.ndim(), "-d mesh");
  to.placements = normalize_placements(placements, static_cast<int64_t>(from.shape.size()), "redistribute");
  if (to.placements == from.placements) return x;
  Tensor out = make_dtensor(redistribute_local(local_tensor(x), from, to.placements), to);
  if (needs_grad({x})) {
    Placements back = from.placements;
    for (auto& p : back)
      if (p.is_partial()) p = Replicate();
    record("redistribute", {x}, out, [back](const std::vector<Tensor>& g, const std::vector<bool>&) {
      return std::vector<Tensor>{redistribute(g[0], back)};
    });
  }
  return out;
}

}  // namespace dtr
