#pragma once
// Plain-text pre-training data: documents are tokenised, joined with an eos token after each
// document, and cut into windows of seq_len + 1 tokens that overlap by one token
// (window i = stream[i*seq_len, i*seq_len + seq_len + 1)), so every token except the first is
// a target exactly once (the llm.c convention). The incomplete tail is dropped. With an eos id,
// each window records where its documents end (Sample::seq_lens, a new document after every
// input position holding eos), as packed SFT rows do, so a document mask can keep attention
// inside documents.
#include <cstdint>
#include <string>
#include <vector>

#include "models/data/sample.h"
#include "models/tokenizer/tokenizer.h"

namespace dtr::data {

/// A packed token stream viewed as fixed windows.
class PackedDataset {
 public:
  /// `eos_id` >= 0: windows carry seq_lens split after each eos input token; -1: one document.
  PackedDataset(std::vector<int32_t> stream, int64_t seq_len, int32_t eos_id = -1);
  /// Number of windows: (stream.size() - 1) / seq_len.
  int64_t size() const;
  int64_t seq_len() const { return seq_len_; }
  /// The seq_len + 1 tokens of window i. Errors: i out of range.
  std::vector<int32_t> window(int64_t i) const;
  /// input_ids = window[0:seq_len], labels = window[1:seq_len+1], seq_lens as above.
  Sample get(int64_t i) const;
  const std::vector<int32_t>& stream() const { return stream_; }

 private:
  std::vector<int32_t> stream_;
  int64_t seq_len_;
  int32_t eos_id_;
};

/// Tokenises each document (special-token text is NOT parsed: raw text stays text) and appends
/// `eos_id` after each one. Errors: eos_id < 0.
std::vector<int32_t> tokenize_documents(const std::vector<std::string>& docs, const tokenizer::Tokenizer& tok,
                                        int32_t eos_id);

/// Splits a file's text into documents at every occurrence of `separator` (empty = the whole
/// file is one document); empty documents are dropped.
std::vector<std::string> split_documents(const std::string& text, const std::string& separator);

/// Reads UTF-8 text files, splits them into documents, tokenises and packs them.
/// Errors: unreadable file; invalid UTF-8 -> dtr::Error with file and byte offset; fewer than
/// seq_len + 1 tokens in total.
PackedDataset load_text_dataset(const std::vector<std::string>& files, const tokenizer::Tokenizer& tok,
                                int64_t seq_len, const std::string& doc_separator = "");

}  // namespace dtr::data
