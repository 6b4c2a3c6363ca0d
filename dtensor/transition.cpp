#include "dtensor/transition.h"

#include <algorithm>

#include "dtensor/comm_debug.h"
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

// ---- the entries' figures ----------------------------------------------------------------------

/// This rank's local shape before the step.
Shape local_shape(const TransitionStep& s) {
  Shape ls, off;
  local_shape_and_offset(s.spec.shape, s.spec.mesh.shape(), s.cur, s.spec.mesh.get_coordinate(), ls, off);
  return ls;
}

/// Bytes of a local tensor of shape `ls` with dim `d` set to `rows`.
int64_t bytes_with_rows(const TransitionStep& s, Shape ls, int64_t d, int64_t rows) {
  ls[d] = rows;
  return shape_numel(ls) * static_cast<int64_t>(itemsize(s.spec.dtype));
}

ProcessGroup& group_of(const TransitionStep& s) { return *s.spec.mesh.group(s.mesh_dim); }
int64_t coord_of(const TransitionStep& s) { return s.spec.mesh.coordinate(s.mesh_dim); }

/// Rows of every rank of a lone StridedShard(d, sf) level and its total.
int64_t strided_level(const TransitionStep& s) {
  int64_t level = 0;
  for (int64_t n : sizes_along(s.spec, s.cur, s.mesh_dim, s.from().dim)) level += n;
  return level;
}

int64_t strided_max_local(const TransitionStep& s) {
  const int64_t n = s.spec.mesh.size(s.mesh_dim);
  const int64_t level = strided_level(s);
  int64_t m = 0;
  for (int64_t r = 0; r < n; ++r) m = std::max(m, strided_local_size(level, s.from().split_factor, n, r));
  return m;
}

// ---- the entries ----------------------------------------------------------------------------------

Tensor run_all_gather(const Tensor& local, const TransitionStep& s) {
  return all_gather_sizes(local, group_of(s), s.from().dim, sizes_along(s.spec, s.cur, s.mesh_dim, s.from().dim));
}
int64_t bytes_all_gather(const TransitionStep& s) {
  const auto sizes = sizes_along(s.spec, s.cur, s.mesh_dim, s.from().dim);
  return bytes_with_rows(s, local_shape(s), s.from().dim, *std::max_element(sizes.begin(), sizes.end()));
}

Tensor run_strided_all_gather(const Tensor& local, const TransitionStep& s) {
  return strided_all_gather_dim(local, group_of(s), s.from().dim, strided_level(s), s.from().split_factor);
}
int64_t bytes_strided_all_gather(const TransitionStep& s) {
  return bytes_with_rows(s, local_shape(s), s.from().dim, strided_max_local(s));
}

/// S(i) -> S(j) in one all_to_all: both plain shards of different dims, and no other mesh dim
/// shards i or j before or after (no nesting).
bool all_to_all_applies(const TransitionStep& s) {
  const Placement& a = s.from();
  if (!a.is_shard() || !s.to.is_shard() || s.to.dim == a.dim) return false;
  for (int j = 0; j < static_cast<int>(s.cur.size()); ++j)
    if (j != s.mesh_dim && (shards_dim(s.cur[j], a.dim) || shards_dim(s.cur[j], s.to.dim) ||
                            shards_dim(s.target[j], a.dim) || shards_dim(s.target[j], s.to.dim)))
      return false;
  return true;
}
Tensor run_all_to_all(const Tensor& local, const TransitionStep& s) {
  const int64_t di = s.from().dim, dj = s.to.dim;
  return all_to_all_dims(local, group_of(s), di, s.spec.shape[di], dj, s.spec.shape[dj], coord_of(s));
}
int64_t bytes_all_to_all(const TransitionStep& s) {
  const int64_t n = s.spec.mesh.size(s.mesh_dim);
  const int64_t di = s.from().dim, dj = s.to.dim;
  Shape ls = local_shape(s);
  ls[di] = (s.spec.shape[di] + n - 1) / n;
  return bytes_with_rows(s, ls, dj, n * ((s.spec.shape[dj] + n - 1) / n));
}

Tensor run_all_reduce(const Tensor& local, const TransitionStep& s) {
  return all_reduce_local(local, group_of(s), s.from().reduce);
}
int64_t bytes_all_reduce(const TransitionStep& s) {
  return shape_numel(local_shape(s)) * static_cast<int64_t>(itemsize(s.spec.dtype));
}

Tensor run_reduce_scatter(const Tensor& local, const TransitionStep& s) {
  return reduce_scatter_dim(local, group_of(s), s.from().reduce, s.to.dim, coord_of(s));
}
int64_t bytes_reduce_scatter(const TransitionStep& s) {
  const int64_t n = s.spec.mesh.size(s.mesh_dim);
  const Shape ls = local_shape(s);
  return bytes_with_rows(s, ls, s.to.dim, n * ((ls[s.to.dim] + n - 1) / n));
}

Tensor run_chunk(const Tensor& local, const TransitionStep& s) {
  const Chunk c = chunk_of(local.sizes()[s.to.dim], s.spec.mesh.size(s.mesh_dim), coord_of(s));
  return local.narrow(s.to.dim, c.size ? c.offset : 0, c.size).contiguous();
}

Tensor run_strided_split(const Tensor& local, const TransitionStep& s) {
  return strided_local_split(local, s.spec.mesh.size(s.mesh_dim), coord_of(s), s.to.dim, s.to.split_factor);
}

/// Replicate -> Partial(sum): floating values are scaled by 1/n on every rank (PyTorch's rule);
/// integer and bool values stay on coordinate 0 and are zero elsewhere (exact). avg / max / min:
/// every rank keeps the value.
Tensor run_to_partial(const Tensor& local, const TransitionStep& s) {
  if (s.to.reduce != ReduceOp::SUM) return local;
  if (is_floating(local.dtype())) return div(local, static_cast<double>(s.spec.mesh.size(s.mesh_dim)));
  return coord_of(s) == 0 ? local : zeros_like(local);
}

double cost_gather(double local, double n) { return local * n; }
double cost_local_bytes(double local, double) { return local; }
double cost_all_reduce(double local, double) { return 2.0 * local; }
double cost_none(double, double) { return 0.0; }

using K = PlacementKind;

}  // namespace

const char* placement_kind_name(PlacementKind k) {
  switch (k) {
    case K::replicate: return "replicate";
    case K::shard: return "shard";
    case K::strided_pieces: return "strided_pieces";
    case K::partial: return "partial";
  }
  return "?";
}

PlacementKind placement_kind(const Placements& pl, const Shape& mesh_shape, int i) {
  const Placement& p = pl[i];
  if (p.is_replicate()) return K::replicate;
  if (p.is_partial()) return K::partial;
  if (p.is_strided_shard() && strided_partners(pl, mesh_shape, i).empty()) return K::strided_pieces;
  return K::shard;
}

const std::vector<Transition>& transitions() {
  static const std::vector<Transition> table = {
      {K::shard, K::replicate, CommKind::all_gather, "all_gather", nullptr, run_all_gather, bytes_all_gather,
       cost_gather},
      {K::strided_pieces, K::replicate, CommKind::all_gather, "strided all_gather", nullptr, run_strided_all_gather,
       bytes_strided_all_gather, cost_gather},
      {K::shard, K::shard, CommKind::all_to_all, "all_to_all", all_to_all_applies, run_all_to_all, bytes_all_to_all,
       cost_local_bytes},
      {K::partial, K::replicate, CommKind::all_reduce, "all_reduce", nullptr, run_all_reduce, bytes_all_reduce,
       cost_all_reduce},
      {K::partial, K::shard, CommKind::reduce_scatter, "reduce_scatter", nullptr, run_reduce_scatter,
       bytes_reduce_scatter, cost_local_bytes},
      {K::replicate, K::shard, std::nullopt, "local chunk", nullptr, run_chunk, nullptr, cost_none},
      {K::replicate, K::strided_pieces, std::nullopt, "local strided split", nullptr, run_strided_split, nullptr,
       cost_none},
      {K::replicate, K::partial, std::nullopt, "local scale", nullptr, run_to_partial, nullptr, cost_none},
  };
  return table;
}

const Transition* find_transition(const TransitionStep& step) {
  const Shape& ms = step.spec.mesh.shape();
  const PlacementKind from = placement_kind(step.cur, ms, step.mesh_dim);
  Placements next = step.cur;
  next[step.mesh_dim] = step.to;
  const PlacementKind to = placement_kind(next, ms, step.mesh_dim);
  for (const Transition& t : transitions())
    if (t.from == from && t.to == to && (!t.applies || t.applies(step))) return &t;
  return nullptr;
}

}  // namespace dtr
