#include "parallel/checkpoint/state_dict.h"

#include <algorithm>

#include "dtensor/api.h"
#include "dtensor/spec.h"
#include "parallel/checkpoint/reshard.h"
#include "tensor/autograd/grad_mode.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace dtr::dcp {
namespace {

/// Every rank's `s`, in rank order (PyTorch's all_gather_object): the lengths, then the bytes
/// padded to the longest, as u8 tensors.
std::vector<std::string> all_gather_strings(ProcessGroup& pg, const std::string& s) {
  const int n = pg.size();
  Tensor len = from_vector<int64_t>({static_cast<int64_t>(s.size())}, {1});
  Tensor lens = empty({n}, TensorOptions(DType::i64));
  pg.all_gather(lens, len)->wait();
  const std::vector<int64_t> l = lens.to_vector<int64_t>();
  const int64_t longest = *std::max_element(l.begin(), l.end()) + 1;
  std::vector<uint8_t> mine(s.begin(), s.end());
  mine.resize(static_cast<size_t>(longest), 0);
  Tensor in = from_vector<uint8_t>(mine, {longest});
  Tensor out = empty({n * longest}, TensorOptions(DType::u8));
  pg.all_gather(out, in)->wait();
  const std::vector<uint8_t> all = out.to_vector<uint8_t>();
  std::vector<std::string> res;
  for (int r = 0; r < n; ++r) res.emplace_back(all.begin() + r * longest, all.begin() + r * longest + l[r]);
  return res;
}

/// Runs `f` on this rank, then agrees with every rank of `pg`: when any failed, every rank
/// throws the first failing rank's message (so no rank is left waiting in a later collective).
template <class F>
void on_every_rank(ProcessGroup& pg, F&& f) {
  std::string err;
  try {
    f();
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "unknown error";
  }
  for (const auto& e : all_gather_strings(pg, err))
    if (!e.empty()) throw Error(e);
}

/// The tensor metadata and this rank's chunk of `t` (a DTensor's local shard at its offset,
/// a plain tensor whole; none when empty).
TensorMetadata local_metadata(const std::string& key, const Tensor& t, const std::string& storage, TensorBlock* block) {
  DTR_CHECK(t.defined(), "dcp: state dict key '", key, "' holds an undefined tensor");
  TensorMetadata m;
  m.dtype = t.dtype();
  if (t.is_distributed()) {
    const DTensorSpec& s = dtensor_spec(t, "dcp");
    DTR_CHECK(!s.has_partial(), "dcp: state dict key '", key, "' has Partial placements ", placements_str(s.placements),
              "; reduce it first (redistribute to Replicate / Shard)");
    m.placements = placements_str(s.placements);
    m.mesh_shape = s.mesh.shape();
  }
  *block = local_block(t, &m.size);
  if (block->tensor.numel() > 0) m.chunks.push_back({block->offset, block->tensor.sizes(), storage});  // uneven: may be empty
  return m;
}

/// Merges every rank's metadata (rank order): a chunk that an earlier rank saved (same
/// offsets and sizes) is dropped. Errors: the same key with another global shape / dtype.
Metadata merge(const std::vector<Metadata>& ranks) {
  Metadata md;
  md.world_size = static_cast<int>(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r)
    for (const auto& [key, t] : ranks[r].state_dict_metadata) {
      auto it = md.state_dict_metadata.find(key);
      if (it == md.state_dict_metadata.end()) {
        md.state_dict_metadata[key] = t;
        continue;
      }
      TensorMetadata& m = it->second;
      DTR_CHECK(m.size == t.size && m.dtype == t.dtype, "dcp: state dict key '", key, "' is ", dtype_name(m.dtype), " ",
                m.size, " on an earlier rank but ", dtype_name(t.dtype), " ", t.size, " on rank ", r);
      for (const auto& c : t.chunks) {
        const bool dup = std::any_of(m.chunks.begin(), m.chunks.end(),
                                     [&](const ChunkMetadata& o) { return o.offsets == c.offsets && o.sizes == c.sizes; });
        if (!dup) m.chunks.push_back(c);
      }
    }
  return md;
}

}  // namespace

void save_state_dict(const StateDict& sd, StorageWriter& writer, ProcessGroup& pg, const nlohmann::json& extra) {
  const int rank = pg.rank();
  // 1. Local plan: this rank's chunks; gathered, merged and deduplicated identically on every rank.
  Metadata local;
  std::map<std::string, TensorBlock> blocks;
  std::string storage, plan;
  on_every_rank(pg, [&] {
    local.world_size = pg.size();
    storage = writer.storage_name(rank);
    for (const auto& [key, t] : sd) local.state_dict_metadata[key] = local_metadata(key, t, storage, &blocks[key]);
    plan = to_json(local).dump();
  });
  std::vector<Metadata> plans;
  for (const auto& p : all_gather_strings(pg, plan)) plans.push_back(metadata_from_json(nlohmann::json::parse(p), "dcp: save plan"));
  Metadata global = merge(plans);
  global.extra = extra;
  // 2. The coordinator prepares the location, 3. every rank writes the chunks it was given,
  // 4. the coordinator writes the metadata and commits.
  on_every_rank(pg, [&] { writer.set_up(rank == 0); });
  on_every_rank(pg, [&] {
    std::vector<WriteItem> items;
    for (const auto& [key, b] : blocks) {
      const auto& chunks = global.state_dict_metadata.at(key).chunks;
      const bool mine = std::any_of(chunks.begin(), chunks.end(), [&](const ChunkMetadata& c) {
        return c.storage == storage && c.offsets == b.offset && c.sizes == b.tensor.sizes();
      });
      if (mine) items.push_back({key, b.tensor.to(Device::cpu()).contiguous(), b.offset});
    }
    writer.write_data(rank, items);
  });
  on_every_rank(pg, [&] {
    if (rank == 0) writer.finish(global);
  });
}

Metadata load_state_dict(const StateDict& sd, StorageReader& reader) {
  Metadata md = reader.read_metadata();
  const std::string where = reader.location();
  NoGradGuard no_grad;
  for (const auto& [key, t] : sd) {
    DTR_CHECK(t.defined(), "dcp: state dict key '", key, "' holds an undefined tensor");
    auto it = md.state_dict_metadata.find(key);
    DTR_CHECK(it != md.state_dict_metadata.end(), "dcp: key '", key, "' is not in ", where, " (it holds ",
              md.state_dict_metadata.size(), " keys)");
    const TensorMetadata& m = it->second;
    Shape global;
    const TensorBlock dst = local_block(t, &global);
    DTR_CHECK(m.size == global, "dcp: key '", key, "' has global shape ", m.size, " in ", where,
              " but the destination has ", global);
    DTR_CHECK(m.dtype == t.dtype(), "dcp: key '", key, "' is ", dtype_name(m.dtype), " in ", where,
              " but the destination is ", dtype_name(t.dtype()));
    DTR_CHECK(!t.is_distributed() || !dtensor_spec(t, "dcp").has_partial(), "dcp: key '", key,
              "': cannot load into a Partial DTensor");
    std::vector<TensorBlock> saved;
    for (const auto& c : m.chunks)
      if (blocks_overlap(c.offsets, c.sizes, dst.offset, dst.tensor.sizes()))
        saved.push_back({reader.read_chunk(key, m, c), c.offsets});
    Tensor scratch = empty(dst.tensor.sizes(), TensorOptions(t.dtype()));
    assemble_block(saved, {scratch, dst.offset}, "dcp: the saved chunks of '" + key + "' in " + where);
    Tensor d = dst.tensor;
    d.copy_(scratch);
  }
  return md;
}

}  // namespace dtr::dcp
