#include "dtensor/redistribute.h"

#include <algorithm>
#include <iostream>

#include "dtensor/comm_debug.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace dtr {
namespace {

Shape move_to_front_perm(int64_t ndim, int64_t d) {
  Shape p{d};
  for (int64_t i = 0; i < ndim; ++i)
    if (i != d) p.push_back(i);
  return p;
}

Shape inverse_perm(const Shape& p) {
  Shape inv(p.size());
  for (size_t i = 0; i < p.size(); ++i) inv[p[i]] = static_cast<int64_t>(i);
  return inv;
}

/// x with dim d zero-padded at the end to `size`.
Tensor pad_dim(const Tensor& x, int64_t d, int64_t size) {
  if (x.sizes()[d] == size) return x;
  Shape s = x.sizes();
  s[d] = size;
  Tensor out = zeros(s, TensorOptions(x.dtype()).with_device(x.device()));
  Tensor region = out.narrow(d, 0, x.sizes()[d]);
  region.copy_(x);
  return out;
}

/// Size of tensor dim d on each rank along mesh dim i (other coordinates this rank's).
std::vector<int64_t> sizes_along(const DTensorSpec& s, const Placements& pl, int i, int64_t d) {
  auto coord = s.mesh.get_coordinate();
  std::vector<int64_t> out;
  Shape ls, off;
  for (int64_t k = 0; k < s.mesh.size(i); ++k) {
    coord[i] = k;
    local_shape_and_offset(s.shape, s.mesh.shape(), pl, coord, ls, off);
    out.push_back(ls[d]);
  }
  return out;
}

/// All-gathers `local` permuted by `perm` (the sharded dim first) with that dim padded to `c`
/// rows: the result holds rank r's rows at [r * c, r * c + c).
Tensor all_gather_padded(const Tensor& local, ProcessGroup& g, const Shape& perm, int64_t c) {
  Tensor x = pad_dim(local.permute(perm).contiguous(), 0, c).contiguous();
  Shape os = x.sizes();
  os[0] = g.size() * c;
  Tensor out = empty(os, TensorOptions(x.dtype()).with_device(x.device()));
  comm_debug_note(CommKind::all_gather);
  g.all_gather(out, x)->wait();
  return out;
}

/// Shard -> Replicate along a group whose ranks hold `sizes` rows of dim d (padded to the
/// largest for the collective, cut after).
Tensor all_gather_sizes(const Tensor& local, ProcessGroup& g, int64_t d, const std::vector<int64_t>& sizes) {
  const int64_t n = g.size();
  const int64_t c = *std::max_element(sizes.begin(), sizes.end());
  Shape perm = move_to_front_perm(local.dim(), d);
  Tensor out = all_gather_padded(local, g, perm, c);
  std::vector<Tensor> pieces;
  for (int64_t r = 0; r < n; ++r)
    if (sizes[r] > 0) pieces.push_back(out.narrow(0, r * c, sizes[r]));
  Tensor whole = pieces.empty() ? out.narrow(0, 0, 0) : cat(pieces, 0);
  return whole.permute(inverse_perm(perm)).contiguous();
}

/// StridedShard(d, sf) -> Replicate: gather every rank's pieces (padded to the largest local
/// size) and put them back block by block: block b = [piece(b, 0), piece(b, 1), ...].
Tensor strided_all_gather_dim(const Tensor& local, ProcessGroup& g, int64_t d, int64_t full, int64_t sf) {
  const int64_t n = g.size();
  int64_t max_local = 0;
  for (int64_t r = 0; r < n; ++r) max_local = std::max(max_local, strided_local_size(full, sf, n, r));
  Shape perm = move_to_front_perm(local.dim(), d);
  Tensor out = all_gather_padded(local, g, perm, max_local);
  std::vector<Tensor> pieces;
  std::vector<int64_t> used(n, 0);  // rows of rank r consumed so far
  for (int64_t b = 0; b < sf; ++b) {
    const int64_t block = chunk_of(full, sf, b).size;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t len = chunk_of(block, n, r).size;
      if (len > 0) pieces.push_back(out.narrow(0, r * max_local + used[r], len));
      used[r] += len;
    }
  }
  Tensor whole = pieces.empty() ? out.narrow(0, 0, 0) : cat(pieces, 0);
  return whole.permute(inverse_perm(perm)).contiguous();
}

/// Replicate -> StridedShard(d, sf): this rank's piece of every block, concatenated.
Tensor strided_local_split(const Tensor& local, int64_t n, int64_t r, int64_t d, int64_t sf) {
  const int64_t full = local.sizes()[d];
  std::vector<Tensor> pieces;
  for (int64_t b = 0; b < sf; ++b) {
    const Chunk blk = chunk_of(full, sf, b);
    const Chunk pc = chunk_of(blk.size, n, r);
    if (pc.size > 0) pieces.push_back(local.narrow(d, blk.offset + pc.offset, pc.size));
  }
  if (pieces.empty()) return local.narrow(d, 0, 0).contiguous();
  return (pieces.size() == 1 ? pieces[0] : cat(pieces, d)).contiguous();
}

Tensor reduce_scatter_dim(const Tensor& local, ProcessGroup& g, ReduceOp op, int64_t d, int64_t rank) {
  const int64_t n = g.size();
  const int64_t full = local.sizes()[d];
  const int64_t c = (full + n - 1) / n;
  Shape perm = move_to_front_perm(local.dim(), d);
  Tensor x = pad_dim(local.permute(perm).contiguous(), 0, n * c).contiguous();
  Shape os = x.sizes();
  os[0] = c;
  Tensor out = empty(os, TensorOptions(x.dtype()).with_device(x.device()));
  comm_debug_note(CommKind::reduce_scatter);
  g.reduce_scatter(out, x, op)->wait();
  const Chunk ch = chunk_of(full, n, rank);
  return out.narrow(0, 0, ch.size).permute(inverse_perm(perm)).contiguous();
}

Tensor all_reduce_local(const Tensor& local, ProcessGroup& g, ReduceOp op) {
  Tensor x = local.clone();
  comm_debug_note(CommKind::all_reduce);
  g.all_reduce(x, op)->wait();
  return x;
}

/// S(i) -> S(j) on one mesh dim with an all_to_all of padded blocks.
Tensor all_to_all_dims(const Tensor& local, ProcessGroup& g, int64_t di, int64_t full_i, int64_t dj, int64_t full_j,
                       int64_t rank) {
  const int64_t n = g.size();
  const int64_t ci = (full_i + n - 1) / n, cj = (full_j + n - 1) / n;
  Tensor x = pad_dim(pad_dim(local, di, ci), dj, n * cj);
  // Split dim j into [n, cj] and bring the n axis to the front: block k goes to rank k.
  Shape s = x.sizes();
  Shape split = s;
  split[dj] = cj;
  split.insert(split.begin() + dj, n);
  Tensor blocks = x.contiguous().view(split);
  blocks = blocks.permute(move_to_front_perm(blocks.dim(), dj)).contiguous();
  Tensor recv = empty(blocks.sizes(), TensorOptions(x.dtype()).with_device(x.device()));
  comm_debug_note(CommKind::all_to_all);
  g.all_to_all(recv, blocks)->wait();
  // recv[k] = rank k's rows of dim i (padded to ci) for my chunk of dim j. Put the source axis
  // before dim i and merge.
  const int64_t di_r = di + 1;  // axis of dim i in recv (block dims follow the source axis)
  Shape perm;
  for (int64_t a = 1; a < recv.dim(); ++a) {
    if (a == di_r) perm.push_back(0);
    perm.push_back(a);
  }
  Tensor merged = recv.permute(perm).contiguous();
  Shape ms = merged.sizes();
  ms.erase(ms.begin() + di);
  ms[di] = n * ci;
  merged = merged.view(ms);
  // Cut the padding: dim i back to full_i (rank k's rows start at k*ci, hold chunk_of(...)).
  std::vector<Tensor> pieces;
  for (int64_t k = 0; k < n; ++k) {
    const Chunk ck = chunk_of(full_i, n, k);
    if (ck.size > 0) pieces.push_back(merged.narrow(di, k * ci, ck.size));
  }
  Tensor full = pieces.empty() ? merged.narrow(di, 0, 0) : (pieces.size() == 1 ? pieces[0] : cat(pieces, di));
  const Chunk mine = chunk_of(full_j, n, rank);
  return full.narrow(dj, 0, mine.size).contiguous();
}

void log_step(const DTensorSpec& s, const RedistributeStep& st) {
  std::cerr << "[dtensor] redistribute mesh dim " << st.mesh_dim << ": " << st.from.str() << " -> " << st.to.str()
            << " for " << s.str() << "\n";
}

}  // namespace

namespace {
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
  // undone before it, so each gather sees its rank's chunk of one level.
  const std::vector<int> from_order = application_order(cur, ms);
  for (auto it = from_order.rbegin(); it != from_order.rend(); ++it) {
    const int i = *it;
    if (!cur[i].shards()) continue;
    const int64_t d = cur[i].dim;
    if (cur[i] == to[i] && shard_prefix(cur, ms, i) == shard_prefix(to, ms, i)) continue;
    // Direct all_to_all when the target is another shard dim and nothing nested interferes.
    if (cur[i].is_shard() && to[i].is_shard() && to[i].dim != d) {
      const int64_t e = to[i].dim;
      bool nested = false;
      for (int j = 0; j < nd; ++j)
        if (j != i && (shards_dim(cur[j], d) || shards_dim(cur[j], e) || shards_dim(to[j], d) || shards_dim(to[j], e)))
          nested = true;
      if (!nested) {
        steps.push_back({i, cur[i], to[i]});
        cur[i] = to[i];
        continue;
      }
    }
    steps.push_back({i, cur[i], Replicate()});
    cur[i] = Replicate();
  }
  // Phase 2: in the target's application order, apply the targets. Partial -> a strided shard
  // that stands alone (no collective splits that way) and Partial -> another Partial op reduce
  // first.
  for (int i : application_order(to, ms)) {
    if (cur[i] == to[i]) continue;
    const bool lone_strided = to[i].is_strided_shard() && strided_partners(to, ms, i).empty();
    if (cur[i].is_partial() && (to[i].is_partial() || lone_strided)) {
      steps.push_back({i, cur[i], Replicate()});
      cur[i] = Replicate();
    }
    steps.push_back({i, cur[i], to[i]});
    cur[i] = to[i];
  }
  return steps;
}

Tensor redistribute_local(const Tensor& local_in, const DTensorSpec& from, const Placements& to_in) {
  NoGradGuard no_grad;
  const auto steps = plan_redistribute(from, to_in);
  const Shape& ms = from.mesh.shape();
  Placements cur = from.placements;
  Tensor local = local_in;
  const auto coord = from.mesh.get_coordinate();
  for (const auto& st : steps) {
    if (dtensor_debug_enabled()) log_step(from, st);
    const int i = st.mesh_dim;
    ProcessGroup& g = *from.mesh.group(i);
    const Placement& a = st.from;
    const Placement& b = st.to;
    if (g.size() == 1) {  // a size-1 mesh dim: every transition is the identity
      cur[i] = b;
      continue;
    }
    // A strided shard standing alone holds pieces of sf blocks; a paired one (after its
    // partners) and a plain shard hold one chunk of the current level.
    const bool a_lone = a.is_strided_shard() && strided_partners(cur, ms, i).empty();
    Placements next = cur;
    next[i] = b;
    const bool b_lone = b.is_strided_shard() && strided_partners(next, ms, i).empty();
    if (a_lone && b.is_replicate()) {
      const auto sizes = sizes_along(from, cur, i, a.dim);
      int64_t level = 0;
      for (int64_t n : sizes) level += n;
      local = strided_all_gather_dim(local, g, a.dim, level, a.split_factor);
    } else if (a.is_replicate() && b_lone) {
      local = strided_local_split(local, g.size(), coord[i], b.dim, b.split_factor);
    } else if (a.shards() && b.is_replicate()) {
      local = all_gather_sizes(local, g, a.dim, sizes_along(from, cur, i, a.dim));
    } else if (a.is_shard() && b.is_shard()) {
      local = all_to_all_dims(local, g, a.dim, from.shape[a.dim], b.dim, from.shape[b.dim], coord[i]);
    } else if (a.is_partial() && b.is_replicate()) {
      local = all_reduce_local(local, g, a.reduce);
    } else if (a.is_partial() && b.shards()) {
      local = reduce_scatter_dim(local, g, a.reduce, b.dim, coord[i]);
    } else if (a.is_replicate() && b.shards()) {
      const Chunk c = chunk_of(local.sizes()[b.dim], g.size(), coord[i]);
      local = local.narrow(b.dim, c.size ? c.offset : 0, c.size).contiguous();
    } else if (a.is_replicate() && b.is_partial()) {
      // Replicate -> Partial(sum): floating values are scaled by 1/n on every rank (PyTorch's
      // rule); integer and bool values stay on coordinate 0 and are zero elsewhere (exact).
      // avg / max / min: every rank keeps the value.
      if (b.reduce == ReduceOp::SUM)
        local = is_floating(local.dtype()) ? div(local, static_cast<double>(g.size()))
                                           : (coord[i] == 0 ? local : zeros_like(local));
    } else {
      DTR_ERROR("redistribute: no transition ", a.str(), " -> ", b.str(), " (", from.str(), ")");
    }
    cur[i] = b;
  }
  return local;
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
