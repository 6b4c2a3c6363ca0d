#include "models/data/sample.h"

#include <algorithm>

#include "models/tokenizer/byte_level.h"
#include "tensor/error.h"

namespace dtr::data {

Batch collate(const std::vector<Sample>& samples, const CollateOptions& opt) {
  DTR_CHECK(!samples.empty(), "collate: empty batch");
  DTR_CHECK(opt.pad_seq_len_divisible >= 1, "collate: pad_seq_len_divisible = ", opt.pad_seq_len_divisible,
            ", expected >= 1");
  int64_t longest = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    DTR_CHECK(s.labels.size() == s.input_ids.size(), "collate: sample ", i, " has ", s.input_ids.size(),
              " input ids and ", s.labels.size(), " labels");
    int64_t docs = 0;
    for (auto n : s.seq_lens) {
      DTR_CHECK(n > 0, "collate: sample ", i, " has a document of length ", n);
      docs += n;
    }
    DTR_CHECK(s.seq_lens.empty() || docs == static_cast<int64_t>(s.input_ids.size()), "collate: sample ", i,
              " has seq_lens summing to ", docs, " but ", s.input_ids.size(), " input ids");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(s.input_ids.size()));
  }
  const int64_t div = opt.pad_seq_len_divisible;
  int64_t T = std::max<int64_t>(1, (longest + div - 1) / div * div);
  if (opt.max_length > 0) T = std::min(T, std::max(longest, opt.max_length));
  const size_t n = samples.size() * static_cast<size_t>(T);
  std::vector<int64_t> ids(n, opt.pad_id), labels(n, kIgnoreIndex), pos, doc;
  if (opt.documents) pos.assign(n, 0), doc.assign(n, 0);
  Batch b;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    const size_t row = i * static_cast<size_t>(T), len = s.input_ids.size();
    for (size_t t = 0; t < len; ++t) {
      ids[row + t] = s.input_ids[t];
      labels[row + t] = s.labels[t];
      b.num_label_tokens += s.labels[t] != kIgnoreIndex;
    }
    if (!opt.documents) continue;
    std::vector<int32_t> lens = s.seq_lens.empty() && len > 0 ? std::vector<int32_t>{static_cast<int32_t>(len)} : s.seq_lens;
    if (static_cast<int64_t>(len) < T) lens.push_back(static_cast<int32_t>(T - static_cast<int64_t>(len)));
    size_t t = row;
    for (size_t d = 0; d < lens.size(); ++d)
      for (int32_t p = 0; p < lens[d]; ++p, ++t) {
        pos[t] = p;
        doc[t] = static_cast<int64_t>(d);
      }
  }
  const Shape shape{static_cast<int64_t>(samples.size()), T};
  b.input_ids = from_vector(ids, shape);
  b.labels = from_vector(labels, shape);
  if (opt.documents) {
    b.position_ids = from_vector(pos, shape);
    b.document_ids = from_vector(doc, shape);
  }
  return b;
}

void check_utf8(std::string_view text, const std::string& file) {
  const size_t ok = tokenizer::valid_utf8_prefix(text);
  DTR_CHECK(ok == text.size(), file, ": not valid UTF-8 at byte offset ", ok);
}

}  // namespace dtr::data
