#pragma once
// Sample / Batch: what every dataset of dtr produces for causal-LM training.
// Labels are already shifted: labels[t] is the token that should follow input_ids[0..t], or
// kIgnoreIndex (-100, PyTorch's cross-entropy default) where no loss is taken (prompt tokens,
// padding). A loss is therefore cross_entropy(logits [B, T, V], labels [B, T], ignore -100)
// with no further shift.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/tensor.h"

namespace dtr::data {

constexpr int32_t kIgnoreIndex = -100;

struct Sample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // same length as input_ids
  /// Lengths of the documents this sample holds, in order, summing to input_ids.size()
  /// (NeMo Automodel's packed `seq_lens`); empty = one document. A packed row (pack_sequences)
  /// and a text window crossing an eos carry several.
  std::vector<int32_t> seq_lens;
};

/// A batch as tensors: input_ids and labels i64 [B, T].
struct Batch {
  Tensor input_ids;
  Tensor labels;
  /// i64 [B, T], defined when collated with `documents`: the position of each token inside its
  /// document (0, 1, ... restarting at every document; padding is one more document), and the
  /// index of its document in the row (0, 1, ...). Attention with a document mask lets query t
  /// see key s only when s <= t and document_ids[s] == document_ids[t].
  Tensor position_ids;
  Tensor document_ids;
  int64_t num_label_tokens = 0;  // labels != -100 (for token-weighted loss averaging)
};

struct CollateOptions {
  int32_t pad_id = 0;  // input id of padding positions (their labels are -100)
  /// The batch is padded to its longest sample rounded up to a multiple of this (Automodel's
  /// default_collater `pad_seq_len_divisible`); 1 = exactly the longest.
  int64_t pad_seq_len_divisible = 1;
  /// > 0: the rounding never goes past max(longest, max_length) (a dataset's seq_len, so
  /// rows never exceed what the model was planned for); 0 = no cap.
  int64_t max_length = 0;
  bool documents = false;  // fill position_ids / document_ids from the samples' seq_lens
};

/// Stacks samples into i64 [B, T] tensors, T = the longest sample rounded up to a multiple of
/// opt.pad_seq_len_divisible (capped by opt.max_length); shorter samples are padded on the right with opt.pad_id / -100.
/// Errors: empty batch, a sample whose labels or seq_lens disagree with its length,
/// pad_seq_len_divisible < 1.
Batch collate(const std::vector<Sample>& samples, const CollateOptions& opt = {});

/// Errors: `text` is not valid UTF-8 -> dtr::Error "<file>: not valid UTF-8 at byte offset N".
void check_utf8(std::string_view text, const std::string& file);

}  // namespace dtr::data
