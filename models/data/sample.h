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
};

/// A batch as tensors: input_ids and labels i64 [B, T].
struct Batch {
  Tensor input_ids;
  Tensor labels;
  int64_t num_label_tokens = 0;  // labels != -100 (for token-weighted loss averaging)
};

/// Stacks samples of equal length into i64 [B, T] tensors. Errors: empty or ragged input.
Batch collate(const std::vector<Sample>& samples);

/// Errors: `text` is not valid UTF-8 -> dtr::Error "<file>: not valid UTF-8 at byte offset N".
void check_utf8(std::string_view text, const std::string& file);

}  // namespace dtr::data
