#include "models/data/packing.h"

#include "tensor/error.h"

namespace dtr::data {

namespace {

void close_pack(Sample& pack, int64_t size, int32_t pad_id, std::vector<Sample>& out) {
  const auto len = static_cast<int64_t>(pack.input_ids.size());
  if (len == 0) return;
  if (len < size) {
    pack.input_ids.resize(static_cast<size_t>(size), pad_id);
    pack.labels.resize(static_cast<size_t>(size), kIgnoreIndex);
    pack.seq_lens.push_back(static_cast<int32_t>(size - len));
  }
  out.push_back(std::move(pack));
  pack = Sample{};
}

}  // namespace

std::vector<Sample> pack_sequences(const std::vector<Sample>& samples, int64_t packed_sequence_size, int32_t pad_id) {
  DTR_CHECK(packed_sequence_size >= 1, "packed_sequence_size = ", packed_sequence_size, ", expected >= 1");
  std::vector<Sample> out;
  Sample pack;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    const auto n = static_cast<int64_t>(s.input_ids.size());
    DTR_CHECK(n > 0, "pack_sequences: sample ", i, " is empty");
    DTR_CHECK(s.seq_lens.size() <= 1, "pack_sequences: sample ", i, " already holds ", s.seq_lens.size(),
              " documents");
    DTR_CHECK(n <= packed_sequence_size, "packed_sequence_size=", packed_sequence_size, ": sample ", i, " has ", n,
              " tokens, more than a pack holds (raise packed_sequence_size to at least dataset.seq_len)");
    if (static_cast<int64_t>(pack.input_ids.size()) + n > packed_sequence_size)
      close_pack(pack, packed_sequence_size, pad_id, out);
    pack.input_ids.insert(pack.input_ids.end(), s.input_ids.begin(), s.input_ids.end());
    pack.labels.insert(pack.labels.end(), s.labels.begin(), s.labels.end());
    pack.seq_lens.push_back(static_cast<int32_t>(n));
  }
  close_pack(pack, packed_sequence_size, pad_id, out);
  return out;
}

}  // namespace dtr::data
