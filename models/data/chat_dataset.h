#pragma once
// Instruction (SFT) data from JSONL. One JSON object per line, either
//   {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
// or {"prompt": "...", "response": "..."} (optionally "system": "..."), rendered by the chat
// template. Loss is taken only on what the assistant says (its contents and the <|im_end|>
// closing them); every prompt token's label is -100. Blank lines are skipped.
#include <cstdint>
#include <string>
#include <vector>

#include "models/data/sample.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "models/tokenizer/chat_template.h"

namespace dtr::data {

using Conversation = std::vector<tokenizer::ChatMessage>;

/// Parses one JSONL line. `where` is "file:line" for messages.
/// Errors: JSON error, neither "messages" nor "prompt"/"response", non-string fields, a
/// message without role/content -> dtr::Error starting with `where`.
Conversation parse_chat_line(const std::string& line, const std::string& where);

/// Reads every conversation of a JSONL file. Errors: as parse_chat_line with "file:line";
/// invalid UTF-8 -> file and byte offset.
std::vector<Conversation> read_chat_jsonl(const std::string& path);

/// Tokenises a conversation: each template segment is encoded separately (special-token text
/// inside a segment is recognised), the train flag of a segment marks its tokens.
/// Returns tokens t[0..n) and a mask m[0..n) (1 = target).
void tokenize_chat(const Conversation& conv, const tokenizer::BPETokenizer& tok, const tokenizer::ChatTemplate& tmpl,
                   std::vector<int32_t>& tokens, std::vector<uint8_t>& mask);

/// A training sample of exactly `seq_len` positions: input_ids = t[0..n-1), labels[i] =
/// t[i+1] where m[i+1] else -100; truncated to seq_len, padded with `pad_id` / -100.
Sample make_chat_sample(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& mask, int64_t seq_len,
                        int32_t pad_id);

/// read_chat_jsonl + tokenize_chat + make_chat_sample for every line. Conversations whose
/// labels are all -100 after truncation are dropped (counted in `dropped` when given).
std::vector<Sample> load_chat_dataset(const std::string& path, const tokenizer::BPETokenizer& tok,
                                      const tokenizer::ChatTemplate& tmpl, int64_t seq_len, int64_t* dropped = nullptr);

}  // namespace dtr::data
