#include "dtensor/placement.h"

#include <algorithm>
#include <sstream>

namespace dtr {

bool Placement::operator==(const Placement& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case Kind::Shard: return dim == o.dim;
    case Kind::Replicate: return true;
    case Kind::Partial: return reduce == o.reduce;
    case Kind::StridedShard: return dim == o.dim && split_factor == o.split_factor;
  }
  return false;
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::Shard: return "Shard(" + std::to_string(dim) + ")";
    case Kind::Replicate: return "Replicate()";
    case Kind::Partial: return std::string("Partial(") + reduce_op_name(reduce) + ")";
    case Kind::StridedShard:
      return "_StridedShard(" + std::to_string(dim) + ", sf=" + std::to_string(split_factor) + ")";
  }
  return "?";
}

Placement Shard(int64_t dim) { return {Placement::Kind::Shard, dim, ReduceOp::SUM, 1}; }
Placement Replicate() { return {Placement::Kind::Replicate, 0, ReduceOp::SUM, 1}; }
Placement Partial(ReduceOp op) {
  DTR_CHECK(op != ReduceOp::PRODUCT, "Partial: product is not a supported pending reduction");
  return {Placement::Kind::Partial, 0, op, 1};
}
Placement StridedShard(int64_t dim, int64_t sf) {
  DTR_CHECK(sf >= 1, "StridedShard: split_factor must be >= 1, got ", sf);
  return {Placement::Kind::StridedShard, dim, ReduceOp::SUM, sf};
}

std::string placements_str(const Placements& p) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < p.size(); ++i) os << (i ? ", " : "") << p[i].str();
  os << ']';
  return os.str();
}

Placements replicate_all(int ndim) { return Placements(static_cast<size_t>(ndim), Replicate()); }

Placements without_partial(const Placements& p) {
  Placements out = p;
  for (auto& x : out)
    if (x.is_partial()) x = Replicate();
  return out;
}

Chunk chunk_of(int64_t size, int64_t n, int64_t idx) {
  const int64_t c = (size + n - 1) / n;
  const int64_t start = std::min(idx * c, size);
  const int64_t end = std::min(start + c, size);
  return {end - start, end > start ? start : size};
}

int64_t strided_local_size(int64_t size, int64_t sf, int64_t n, int64_t r) {
  int64_t total = 0;
  for (int64_t b = 0; b < sf; ++b) total += chunk_of(chunk_of(size, sf, b).size, n, r).size;
  return total;
}

Placements normalize_placements(const Placements& p, int64_t ndim, const char* op) {
  Placements out = p;
  for (auto& pl : out) {
    if (!pl.shards()) continue;
    DTR_CHECK(pl.dim >= -ndim && pl.dim < ndim, op, ": ", pl.str(), " is out of range for a ", ndim,
              "-d tensor (placements ", placements_str(p), ")");
    if (pl.dim < 0) pl.dim += ndim;
  }
  return out;
}

std::vector<int> strided_partners(const Placements& pl, const Shape& mesh_shape, size_t i) {
  std::vector<int> later;
  if (!pl[i].is_strided_shard()) return later;
  int64_t prod = 1;
  for (size_t j = i + 1; j < pl.size(); ++j)
    if (pl[j].is_shard(pl[i].dim)) {
      later.push_back(static_cast<int>(j));
      prod *= mesh_shape[j];
    }
  if (prod != pl[i].split_factor) later.clear();
  return later;
}

std::vector<int> application_order(const Placements& pl, const Shape& mesh_shape) {
  std::vector<int> order;
  std::vector<bool> done(pl.size(), false);
  for (size_t i = 0; i < pl.size(); ++i) {
    if (done[i]) continue;
    for (int j : strided_partners(pl, mesh_shape, i)) {
      order.push_back(j);
      done[j] = true;
    }
    order.push_back(static_cast<int>(i));
  }
  return order;
}

void local_shape_and_offset(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
                            const std::vector<int64_t>& coordinate, Shape& local_shape, Shape& offset) {
  local_shape = global_shape;
  offset.assign(global_shape.size(), 0);
  for (int i : application_order(placements, mesh_shape)) {
    const Placement& p = placements[i];
    if (!p.shards()) continue;
    const int64_t d = p.dim;
    const int64_t n = mesh_shape[i];
    // Shard, or a StridedShard after its partners (FSDP + TP: the TP dims split first and this
    // rank holds its torch.chunk of the TP block, one contiguous range; PyTorch's _StridedShard
    // order): this rank's chunk of the current local size.
    if (p.is_shard() || !strided_partners(placements, mesh_shape, i).empty()) {
      const Chunk c = chunk_of(local_shape[d], n, coordinate[i]);
      if (c.size == 0) offset[d] = global_shape[d];
      else if (offset[d] != global_shape[d]) offset[d] += c.offset;
      local_shape[d] = c.size;
      continue;
    }
    // A strided shard alone on its dim (e.g. halfway through a redistribution): this rank's
    // piece of each of the split_factor blocks. The rows are not one range; the offset
    // reported is that of the first piece.
    const Chunk first = chunk_of(chunk_of(local_shape[d], p.split_factor, 0).size, n, coordinate[i]);
    offset[d] += first.offset;
    local_shape[d] = strided_local_size(local_shape[d], p.split_factor, n, coordinate[i]);
  }
}

}  // namespace dtr
