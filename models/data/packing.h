#pragma once
// Sequence packing for SFT (NeMo Automodel's `packed_sequence_size`, its pack_dataset with
// split_across_pack = False, after torchtune's PackedDataset): samples are taken in dataset
// order and appended to the current pack while they fit in packed_sequence_size tokens; a
// sample that does not fit starts the next pack (never split). Each pack is padded to
// packed_sequence_size (pad_id / label -100) and records its documents' lengths in seq_lens,
// the padding as one more document, so sum(seq_lens) = packed_sequence_size. The model then
// runs each row with per-document position ids and a block-diagonal causal mask
// (collate(..., documents = true) builds both), so a packed row computes exactly what its
// samples compute alone. Labels are the samples' own (already shifted inside each sample), so
// no target crosses a document.
#include <cstdint>
#include <vector>

#include "models/data/sample.h"

namespace dtr::data {

/// Packs `samples` (each a single document: seq_lens empty) into rows of exactly
/// `packed_sequence_size` tokens. Differences from Automodel: padding positions count from 0
/// as their own document (Automodel continues the last position), which only the ignored
/// padding outputs see.
/// Errors: packed_sequence_size < 1; a sample longer than packed_sequence_size or empty, or
/// one already holding several documents -> dtr::Error naming the sample index.
std::vector<Sample> pack_sequences(const std::vector<Sample>& samples, int64_t packed_sequence_size, int32_t pad_id);

}  // namespace dtr::data
