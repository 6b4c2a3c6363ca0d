#include "models/data/sample.h"

#include "models/tokenizer/byte_level.h"
#include "tensor/error.h"

namespace dtr::data {

Batch collate(const std::vector<Sample>& samples) {
  DTR_CHECK(!samples.empty(), "collate: empty batch");
  const auto T = static_cast<int64_t>(samples[0].input_ids.size());
  std::vector<int64_t> ids, labels;
  ids.reserve(samples.size() * static_cast<size_t>(T));
  labels.reserve(ids.capacity());
  Batch b;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    DTR_CHECK(static_cast<int64_t>(s.input_ids.size()) == T && s.labels.size() == s.input_ids.size(), "collate: sample ",
              i, " has ", s.input_ids.size(), " input ids and ", s.labels.size(), " labels, expected ", T);
    for (auto v : s.input_ids) ids.push_back(v);
    for (auto v : s.labels) {
      labels.push_back(v);
      b.num_label_tokens += v != kIgnoreIndex;
    }
  }
  const Shape shape{static_cast<int64_t>(samples.size()), T};
  b.input_ids = from_vector(ids, shape);
  b.labels = from_vector(labels, shape);
  return b;
}

void check_utf8(std::string_view text, const std::string& file) {
  const size_t ok = tokenizer::valid_utf8_prefix(text);
  DTR_CHECK(ok == text.size(), file, ": not valid UTF-8 at byte offset ", ok);
}

}  // namespace dtr::data
