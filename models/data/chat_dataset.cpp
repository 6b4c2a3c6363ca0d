#include "models/data/chat_dataset.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "models/formats/mapped_file.h"
#include "tensor/error.h"

namespace dtr::data {

using nlohmann::json;

namespace {
std::string str_field(const json& o, const char* key, const std::string& where) {
  DTR_CHECK(o.contains(key), where, ": missing key '", key, "'");
  DTR_CHECK(o[key].is_string(), where, ": key '", key, "' must be a string, got ", o[key].type_name());
  return o[key].get<std::string>();
}
}  // namespace

Conversation parse_chat_line(const std::string& line, const std::string& where) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    DTR_ERROR(where, ": invalid JSON at column ", e.byte, ": ", e.what());
  } catch (const json::exception& e) {  // e.g. out_of_range: a number too large for a double
    DTR_ERROR(where, ": JSON error: ", e.what());
  }
  DTR_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  Conversation c;
  if (j.contains("messages")) {
    DTR_CHECK(j["messages"].is_array() && !j["messages"].empty(), where, ": 'messages' must be a non-empty array");
    for (size_t i = 0; i < j["messages"].size(); ++i) {
      const json& m = j["messages"][i];
      const std::string w = where + ": messages[" + std::to_string(i) + "]";
      DTR_CHECK(m.is_object(), w, ": expected an object with role and content");
      c.push_back({str_field(m, "role", w), str_field(m, "content", w)});
    }
    return c;
  }
  DTR_CHECK(j.contains("prompt") && j.contains("response"), where,
            ": expected {\"messages\": [...]} or {\"prompt\": ..., \"response\": ...}");
  if (j.contains("system")) c.push_back({"system", str_field(j, "system", where)});
  c.push_back({"user", str_field(j, "prompt", where)});
  c.push_back({"assistant", str_field(j, "response", where)});
  return c;
}

std::vector<Conversation> read_chat_jsonl(const std::string& path) {
  const std::string text = read_file_to_string(path);
  check_utf8(text, path);
  std::vector<Conversation> out;
  size_t start = 0, lineno = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++lineno;
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos)
      out.push_back(parse_chat_line(line, path + ":" + std::to_string(lineno)));
    start = end + 1;
  }
  return out;
}

std::vector<uint8_t> span_mask(const ByteSpans& offsets, const ByteSpans& spans) {
  std::vector<uint8_t> mask(offsets.size(), 0);
  size_t k = 0;  // first span that does not end at or before the current token
  for (size_t i = 0; i < offsets.size(); ++i) {
    const auto [begin, end] = offsets[i];
    while (k < spans.size() && spans[k].second <= begin) ++k;
    if (k == spans.size()) break;
    mask[i] = end > begin && end > spans[k].first;
  }
  return mask;
}

void tokenize_chat(const Conversation& conv, const tokenizer::Tokenizer& tok, const tokenizer::ChatTemplate& tmpl,
                   std::vector<int32_t>& tokens, std::vector<uint8_t>& mask) {
  std::string text;
  ByteSpans train;
  for (const auto& seg : tmpl.render_segments(conv, /*add_generation_prompt=*/false)) {
    if (seg.train) train.emplace_back(text.size(), text.size() + seg.text.size());
    text += seg.text;
  }
  ByteSpans offsets;
  tokens = tok.encode_with_offsets(text, offsets, /*add_special=*/false, /*parse_special=*/true);
  mask = span_mask(offsets, train);
}

Sample make_chat_sample(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& mask, int64_t seq_len) {
  DTR_CHECK(seq_len > 0, "make_chat_sample: seq_len = ", seq_len);
  DTR_CHECK(tokens.size() == mask.size(), "make_chat_sample: ", tokens.size(), " tokens but ", mask.size(), " mask entries");
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(tokens.size()) - 1, seq_len);
  Sample s;
  for (int64_t i = 0; i < n; ++i) {
    s.input_ids.push_back(tokens[static_cast<size_t>(i)]);
    s.labels.push_back(mask[static_cast<size_t>(i + 1)] ? tokens[static_cast<size_t>(i + 1)] : kIgnoreIndex);
  }
  return s;
}

std::vector<Sample> load_chat_dataset(const std::string& path, const tokenizer::Tokenizer& tok,
                                      const tokenizer::ChatTemplate& tmpl, int64_t seq_len, int64_t* dropped) {
  std::vector<Sample> out;
  int64_t drop = 0;
  std::vector<int32_t> t;
  std::vector<uint8_t> m;
  for (const auto& conv : read_chat_jsonl(path)) {
    tokenize_chat(conv, tok, tmpl, t, m);
    Sample s = make_chat_sample(t, m, seq_len);
    bool any = false;
    for (auto l : s.labels) any |= l != kIgnoreIndex;
    if (any) out.push_back(std::move(s));
    else ++drop;
  }
  if (dropped) *dropped = drop;
  return out;
}

}  // namespace dtr::data
