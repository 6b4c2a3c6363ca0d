#pragma once
// Instruction data in the formats of NeMo Automodel's dataset builders, read from local files
// (dataset.type squad | column_mapped; automodel_compat.h maps the builders' `_target_` here).
//   squad:         {"context", "question", "answers": {"text": [...]}}: prompt
//                  "Context: {context} Question: {question} Answer: ", answer = answers.text[0]
//                  stripped (make_squad_dataset); rendered with the chat template when the
//                  tokenizer has one (Automodel's rule), as [user: prompt, assistant: answer].
//   column_mapped: fields named by column_mapping {context, question, answer}: prompt
//                  "context question " (the present ones joined by spaces, trailing space),
//                  prompt-completion without chat template (ColumnMappedTextInstructionDataset,
//                  use_hf_chat_template false, answer_only_loss_mask true).
// Prompt-completion: ids = tokenizer(prompt + answer) (bos when the tokenizer adds one), loss on
// the ids after the first len(bos + tokenizer(prompt)) (format_prompt_completion). A file is a
// JSON array of objects, or one object per line (JSONL).
// Source: NVIDIA-NeMo/Automodel 36044ad, components/datasets/llm/{squad.py,
// column_mapped_text_instruction_dataset.py, formatting_utils.py}.
#include <string>
#include <vector>

#include "apps/train/recipe.h"
#include "models/data/chat_dataset.h"
#include "models/data/sample.h"
#include "models/tokenizer/tokenizer.h"

namespace dtr::train {

/// One record as text: the prompt and the answer of the builder (see above).
struct InstructionRecord {
  std::string context, question, prompt, answer;
};

/// Reads `path` (JSON array or JSONL) for dataset type `d.type`. Errors (one line naming the file
/// and record): JSON syntax, a missing or non-string field, squad answers.text empty.
std::vector<InstructionRecord> read_instruction_records(const DatasetRecipe& d, const std::string& path);

/// Samples of `d` (every path): chat-rendered (squad with `chat`) or prompt-completion, truncated
/// to d.seq_len (0: not truncated) and unpadded (the trainer's collate pads each micro-batch to
/// its longest sample, as Automodel's default collater). Records with no loss token left are
/// dropped.
std::vector<data::Sample> load_instruction_dataset(const DatasetRecipe& d, const tokenizer::Tokenizer& tok,
                                                   bool chat);

/// Whether the tokenizer at `path` (GGUF, tokenizer.json, or an HF directory) carries a chat
/// template (GGUF tokenizer.chat_template; tokenizer_config.json "chat_template").
bool tokenizer_has_chat_template(const std::string& path);

}  // namespace dtr::train
