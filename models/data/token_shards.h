#pragma once
// llm.c token shards (.bin): a header of 256 little-endian int32 followed by the tokens.
//   header[0] = 20240520 (magic), header[1] = version (1: uint16 tokens, 2: uint32 tokens),
//   header[2] = number of tokens; the rest of the header is zero.
// Source: karpathy/llm.c dev/data/data_common.py write_datafile().
#include <cstdint>
#include <string>
#include <vector>

#include "models/data/text_dataset.h"

namespace dtr::data {

constexpr int32_t kShardMagic = 20240520;
constexpr int kShardHeaderInts = 256;

/// Reads a shard's tokens. Errors: short header, bad magic, unknown version, token count that
/// disagrees with the file size -> dtr::Error naming the file and the value.
std::vector<uint32_t> read_token_shard(const std::string& path);

/// Writes a shard atomically. `version` 1 needs every token < 65536. Errors: a token too large
/// for the version, more than INT32_MAX tokens.
void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens, int version = 1);

/// Concatenates the tokens of several shards (in the given order; llm.c shards already hold
/// their own document separators) and views them as seq_len + 1 windows.
/// Errors: as read_token_shard; a token above INT32_MAX; fewer than seq_len + 1 tokens.
PackedDataset load_token_shard_dataset(const std::vector<std::string>& files, int64_t seq_len);

}  // namespace dtr::data
