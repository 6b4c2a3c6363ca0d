#pragma once
// Instruction (SFT) data from JSONL. One JSON object per line, either
//   {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
// or {"prompt": "...", "response": "..."} (optionally "system": "..."), rendered by the chat
// template and tokenised as one text. Loss is taken only on tokens holding what the assistant
// says (its contents and the <|im_end|> closing them; see span_mask for a token straddling the
// boundary); every other token's label is -100. Blank lines are skipped.
#include <cstdint>
#include <string>
#include <vector>

#include "models/data/sample.h"
#include "models/tokenizer/tokenizer.h"
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

/// Byte ranges [begin, end) of a text.
using ByteSpans = std::vector<std::pair<size_t, size_t>>;

/// Loss mask of tokens with byte ranges `offsets` (in order, as BPETokenizer::encode_with_offsets
/// gives them) against trainable ranges `spans` (in order, disjoint): 1 when the token's range
/// overlaps a span (token.end > span.begin and token.begin < span.end), so a token straddling a
/// span boundary (e.g. "\n " = template newline + the reply's leading space) is trained. This is
/// transformers' apply_chat_template(return_assistant_tokens_mask=True) rule (v5; character
/// offsets there), which NeMo Automodel's chat datasets use. Empty ranges (bos) are never in.
std::vector<uint8_t> span_mask(const ByteSpans& offsets, const ByteSpans& spans);

/// Tokenises a conversation as inference sees it: the rendered text (ChatTemplate::render) is
/// encoded once (special-token text is recognised), so the ids are the tokenizer's ids of the
/// whole conversation; the mask comes from span_mask against the trainable segments' byte
/// ranges (assistant contents and their <|im_end|>). Returns tokens t[0..n) and a mask m[0..n)
/// (1 = target).
void tokenize_chat(const Conversation& conv, const tokenizer::Tokenizer& tok, const tokenizer::ChatTemplate& tmpl,
                   std::vector<int32_t>& tokens, std::vector<uint8_t>& mask);

/// A training sample of min(n - 1, seq_len) positions: input_ids = t[0..n-1), labels[i] =
/// t[i+1] where m[i+1] else -100, truncated to seq_len. Not padded: collate pads each batch to
/// its longest sample, pack_sequences fills packs.
Sample make_chat_sample(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& mask, int64_t seq_len);

/// read_chat_jsonl + tokenize_chat + make_chat_sample for every line (unpadded samples). Conversations whose
/// labels are all -100 after truncation are dropped (counted in `dropped` when given).
std::vector<Sample> load_chat_dataset(const std::string& path, const tokenizer::Tokenizer& tok,
                                      const tokenizer::ChatTemplate& tmpl, int64_t seq_len, int64_t* dropped = nullptr);

}  // namespace dtr::data
