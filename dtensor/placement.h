#pragma once
// Placements of a distributed tensor along one mesh dim: Shard(dim), Replicate(), Partial(op),
// and the strided shard FSDP + TP use when both shard the same tensor dim. Local shapes and
// offsets follow torch.chunk (chunk = ceil(n / k); trailing ranks may hold fewer rows or
// none). Source: PyTorch torch.distributed.tensor.placement_types.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/process_group.h"
#include "tensor/tensor.h"

namespace dtr {

class DeviceMesh;

/// One mesh dim's placement. Compared by value.
struct Placement {
  enum class Kind : uint8_t { Shard, Replicate, Partial, StridedShard };
  Kind kind = Kind::Replicate;
  int64_t dim = 0;                  // Shard / StridedShard: tensor dim
  ReduceOp reduce = ReduceOp::SUM;  // Partial: pending reduction
  int64_t split_factor = 1;         // StridedShard: how many times a later mesh dim split it

  bool is_shard() const { return kind == Kind::Shard; }
  bool is_shard(int64_t d) const { return kind == Kind::Shard && dim == d; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool is_strided_shard() const { return kind == Kind::StridedShard; }
  /// Shard or StridedShard of any dim.
  bool shards() const { return kind == Kind::Shard || kind == Kind::StridedShard; }
  bool operator==(const Placement& o) const;
  bool operator!=(const Placement& o) const { return !(*this == o); }
  std::string str() const;
};

using Placements = std::vector<Placement>;

/// Shard(dim): the tensor is split along `dim` (negative dims are normalised when the
/// placement meets a tensor).
Placement Shard(int64_t dim);
Placement Replicate();
/// Partial(op): every rank holds a term of a pending reduction (sum, avg, max, min).
Placement Partial(ReduceOp op = ReduceOp::SUM);
/// _StridedShard(dim, split_factor): FSDP's shard of a dim that TP (a later mesh dim) also
/// shards; rank r holds the r-th chunk of every one of `split_factor` TP blocks.
Placement StridedShard(int64_t dim, int64_t split_factor);

std::string placements_str(const Placements& p);
/// [Replicate()] * ndim.
Placements replicate_all(int ndim);
/// p with every Partial replaced by Replicate.
Placements without_partial(const Placements& p);

/// torch.chunk rule: size and start of chunk `idx` of `size` split in `n`. An empty chunk
/// starts at `size` (so checkpoint offsets never collide).
struct Chunk {
  int64_t size;
  int64_t offset;
};
Chunk chunk_of(int64_t size, int64_t n, int64_t idx);

/// Rows rank `r` of `n` holds of a dim of `size` placed StridedShard(sf): the dim is split into
/// sf blocks (torch.chunk) and the rank takes its torch.chunk piece of every block.
int64_t strided_local_size(int64_t size, int64_t sf, int64_t n, int64_t r);
/// True when `p` shards tensor dim `d` (Shard or StridedShard).
inline bool shards_dim(const Placement& p, int64_t d) { return p.shards() && p.dim == d; }

/// The later mesh dims that a StridedShard(d, sf) at mesh dim `i` of `pl` pairs with: the
/// Shard(d) mesh dims right of i, when their sizes multiply to sf (the FSDP + TP layout, in which
/// they split d first and i takes its chunk of their block). Empty when pl[i] is not a strided
/// shard or stands alone (then the rank holds its piece of each of the sf blocks).
std::vector<int> strided_partners(const Placements& pl, const Shape& mesh_shape, size_t i);

/// Mesh dims in the order their placements apply to the local shard: left to right, except that
/// a paired StridedShard applies right after its partners (see strided_partners). Every mesh dim
/// appears once.
std::vector<int> application_order(const Placements& pl, const Shape& mesh_shape);

/// Normalises negative shard dims against `ndim`; errors name the placement and shape.
Placements normalize_placements(const Placements& p, int64_t ndim, const char* op);

/// Local shape and global offset of the shard at `coordinate` (one entry per mesh dim) of a
/// tensor of `global_shape` placed by `placements` on a mesh of `mesh_shape`. Mesh dims
/// apply in application_order to the current local size (nested sharding).
void local_shape_and_offset(const Shape& global_shape, const Shape& mesh_shape, const Placements& placements,
                            const std::vector<int64_t>& coordinate, Shape& local_shape, Shape& offset);

}  // namespace dtr
