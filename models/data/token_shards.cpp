#include "models/data/token_shards.h"

#include <cstring>

#include "models/formats/mapped_file.h"
#include "tensor/error.h"

namespace dtr::data {

std::vector<uint32_t> read_token_shard(const std::string& path) {
  auto f = MappedFile::open(path);
  const size_t hb = kShardHeaderInts * sizeof(int32_t);
  DTR_CHECK(f->size() >= hb, path, ": ", f->size(), " bytes, shorter than the 1024-byte llm.c header");
  int32_t h[3];
  std::memcpy(h, f->data(), sizeof h);
  DTR_CHECK(h[0] == kShardMagic, path, ": bad magic ", h[0], " at offset 0 (expected ", kShardMagic, ")");
  DTR_CHECK(h[1] == 1 || h[1] == 2, path, ": unknown version ", h[1], " at offset 4 (1: uint16 tokens, 2: uint32)");
  DTR_CHECK(h[2] >= 0, path, ": negative token count ", h[2], " at offset 8");
  const size_t w = h[1] == 1 ? 2 : 4;
  const uint64_t n = static_cast<uint64_t>(h[2]);
  DTR_CHECK(f->size() - hb == n * w, path, ": header says ", n, " tokens (", n * w, " bytes) but ", f->size() - hb,
            " bytes follow the header");
  std::vector<uint32_t> out(n);
  const uint8_t* p = f->data() + hb;
  for (uint64_t i = 0; i < n; ++i) {
    if (w == 2) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = v;
    } else {
      std::memcpy(&out[i], p + 4 * i, 4);
    }
  }
  return out;
}

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version) {
  DTR_CHECK(version == 1 || version == 2, "write_token_shard(", path, "): version ", version, " (expected 1 or 2)");
  DTR_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "write_token_shard(", path, "): too many tokens");
  int32_t h[kShardHeaderInts] = {};
  h[0] = kShardMagic;
  h[1] = version;
  h[2] = static_cast<int32_t>(tokens.size());
  AtomicFileWriter out(path);
  out.write(h, sizeof h);
  if (version == 1) {
    std::vector<uint16_t> t(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      DTR_CHECK(tokens[i] < 65536, "write_token_shard(", path, "): token ", tokens[i], " at index ", i,
                " does not fit uint16 (use version 2)");
      t[i] = static_cast<uint16_t>(tokens[i]);
    }
    out.write(t.data(), t.size() * 2);
  } else {
    out.write(tokens.data(), tokens.size() * 4);
  }
  out.commit();
}

PackedDataset load_token_shard_dataset(const std::vector<std::string>& files, int64_t seq_len) {
  std::vector<int32_t> stream;
  for (const auto& f : files) {
    for (uint32_t t : read_token_shard(f)) {
      DTR_CHECK(t <= static_cast<uint32_t>(INT32_MAX), f, ": token ", t, " does not fit int32");
      stream.push_back(static_cast<int32_t>(t));
    }
  }
  DTR_CHECK(static_cast<int64_t>(stream.size()) >= seq_len + 1, "token shards: only ", stream.size(),
            " tokens in total, fewer than seq_len + 1 = ", seq_len + 1);
  return PackedDataset(std::move(stream), seq_len);
}

}  // namespace dtr::data
