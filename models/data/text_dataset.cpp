#include "models/data/text_dataset.h"

#include "models/formats/mapped_file.h"
#include "tensor/error.h"

namespace dtr::data {

PackedDataset::PackedDataset(std::vector<int32_t> stream, int64_t seq_len, int32_t eos_id)
    : stream_(std::move(stream)), seq_len_(seq_len), eos_id_(eos_id) {
  DTR_CHECK(seq_len > 0, "PackedDataset: seq_len = ", seq_len, " must be positive");
}

int64_t PackedDataset::size() const {
  return stream_.size() < 2 ? 0 : static_cast<int64_t>(stream_.size() - 1) / seq_len_;
}

std::vector<int32_t> PackedDataset::window(int64_t i) const {
  DTR_CHECK(i >= 0 && i < size(), "PackedDataset: window ", i, " out of range [0, ", size(), ")");
  auto b = stream_.begin() + i * seq_len_;
  return std::vector<int32_t>(b, b + seq_len_ + 1);
}

Sample PackedDataset::get(int64_t i) const {
  const auto w = window(i);
  Sample s;
  s.input_ids.assign(w.begin(), w.end() - 1);
  s.labels.assign(w.begin() + 1, w.end());
  if (eos_id_ < 0) return s;
  int32_t start = 0;
  for (int32_t t = 0; t < static_cast<int32_t>(s.input_ids.size()); ++t)
    if (s.input_ids[static_cast<size_t>(t)] == eos_id_ || t + 1 == static_cast<int32_t>(s.input_ids.size())) {
      s.seq_lens.push_back(t + 1 - start);
      start = t + 1;
    }
  if (s.seq_lens.size() == 1) s.seq_lens.clear();
  return s;
}

std::vector<int32_t> tokenize_documents(const std::vector<std::string>& docs, const tokenizer::Tokenizer& tok,
                                        int32_t eos_id) {
  DTR_CHECK(eos_id >= 0, "tokenize_documents: the tokenizer has no eos token to separate documents");
  std::vector<int32_t> out;
  for (const auto& d : docs) {
    auto ids = tok.encode(d, /*add_special=*/false, /*parse_special=*/false);
    out.insert(out.end(), ids.begin(), ids.end());
    out.push_back(eos_id);
  }
  return out;
}

std::vector<std::string> split_documents(const std::string& text, const std::string& separator) {
  std::vector<std::string> docs;
  if (separator.empty()) {
    if (!text.empty()) docs.push_back(text);
    return docs;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t p = text.find(separator, start);
    if (p == std::string::npos) p = text.size();
    if (p > start) docs.push_back(text.substr(start, p - start));
    start = p + separator.size();
  }
  return docs;
}

PackedDataset load_text_dataset(const std::vector<std::string>& files, const tokenizer::Tokenizer& tok,
                                int64_t seq_len, const std::string& doc_separator) {
  std::vector<int32_t> stream;
  for (const auto& f : files) {
    const std::string text = read_file_to_string(f);
    check_utf8(text, f);
    auto ids = tokenize_documents(split_documents(text, doc_separator), tok, tok.eos_id());
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  DTR_CHECK(static_cast<int64_t>(stream.size()) >= seq_len + 1, "text dataset: only ", stream.size(),
            " tokens in total, fewer than seq_len + 1 = ", seq_len + 1);
  return PackedDataset(std::move(stream), seq_len, tok.eos_id());
}

}  // namespace dtr::data
