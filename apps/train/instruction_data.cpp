#include "apps/train/instruction_data.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "models/formats/gguf.h"
#include "models/tokenizer/chat_template.h"
#include "tensor/error.h"

namespace dtr::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string strip(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\n\r\f\v");
  return s.substr(b, e - b + 1);
}

std::string text_field(const json& rec, const std::string& key, const std::string& where, bool required) {
  if (!rec.contains(key) || rec[key].is_null()) {
    DTR_CHECK(!required, where, ": no field '", key, "'");
    return "";
  }
  DTR_CHECK(rec[key].is_string(), where, ": field '", key, "' is not a string");
  return rec[key].get<std::string>();
}

InstructionRecord make_record(const DatasetRecipe& d, const json& rec, const std::string& where) {
  DTR_CHECK(rec.is_object(), where, ": expected a JSON object");
  InstructionRecord r;
  if (d.type == "squad") {
    r.context = text_field(rec, "context", where, true);
    r.question = text_field(rec, "question", where, true);
    DTR_CHECK(rec.contains("answers") && rec["answers"].is_object() && rec["answers"].contains("text") &&
                  rec["answers"]["text"].is_array() && !rec["answers"]["text"].empty() &&
                  rec["answers"]["text"][0].is_string(),
              where, ": expected answers.text, a non-empty list of strings");
    r.answer = strip(rec["answers"]["text"][0].get<std::string>());
    r.prompt = "Context: " + r.context + " Question: " + r.question + " Answer: ";
  } else {
    auto field = [&](const char* role) {
      auto it = d.column_mapping.find(role);
      return it == d.column_mapping.end() ? std::string() : text_field(rec, it->second, where, true);
    };
    r.context = field("context");
    r.question = field("question");
    r.answer = field("answer");
    for (const char* role : {"context", "question"})
      if (d.column_mapping.count(role)) r.prompt += (role == std::string("context") ? r.context : r.question) + " ";
    DTR_CHECK(r.prompt.size() > 1, where, ": empty prompt (column_mapping needs context or question)");
  }
  return r;
}

}  // namespace

std::vector<InstructionRecord> read_instruction_records(const DatasetRecipe& d, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DTR_CHECK(in.good(), "cannot read dataset file '", path, "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<InstructionRecord> out;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {  // a JSON array of records
    json all;
    try {
      all = json::parse(text);
    } catch (const json::exception& e) {
      DTR_ERROR(path, ": JSON: ", e.what());
    }
    for (size_t i = 0; i < all.size(); ++i) out.push_back(make_record(d, all[i], path + " record " + std::to_string(i)));
    return out;
  }
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    json rec;
    try {
      rec = json::parse(line);
    } catch (const json::exception& e) {
      DTR_ERROR(where, ": JSON: ", e.what());
    }
    out.push_back(make_record(d, rec, where));
  }
  return out;
}

bool tokenizer_has_chat_template(const std::string& path) {
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0)
    return gguf::GGUFFile::open(path).has("tokenizer.chat_template");
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  std::ifstream in(dir / "tokenizer_config.json");
  if (!in.good()) return false;
  try {
    const json cfg = json::parse(in);
    return cfg.contains("chat_template") && !cfg["chat_template"].is_null();
  } catch (const json::exception&) {
    return false;
  }
}

std::vector<data::Sample> load_instruction_dataset(const DatasetRecipe& d, const tokenizer::Tokenizer& tok,
                                                   bool chat) {
  const auto tmpl = tokenizer::ChatTemplate::from_name(d.chat_template);
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<uint8_t>> masks;
  for (const auto& path : d.paths)
    for (const auto& r : read_instruction_records(d, path)) {
      std::vector<int32_t> t;
      std::vector<uint8_t> m;
      if (chat && d.type == "squad") {
        data::tokenize_chat({{"user", r.prompt}, {"assistant", r.answer}}, tok, tmpl, t, m);
      } else {  // format_prompt_completion
        t = tok.encode(r.prompt + r.answer, true);
        const size_t n_prompt = tok.encode(r.prompt, true).size();
        m.assign(t.size(), 0);
        for (size_t i = n_prompt; i < t.size(); ++i) m[i] = 1;
      }
      ids.push_back(std::move(t));
      masks.push_back(std::move(m));
    }
  int64_t seq_len = d.seq_len;
  if (seq_len == 0)
    for (const auto& t : ids) seq_len = std::max<int64_t>(seq_len, static_cast<int64_t>(t.size()) - 1);
  seq_len = std::max<int64_t>(seq_len, 2);
  std::vector<data::Sample> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    data::Sample s = data::make_chat_sample(ids[i], masks[i], seq_len);
    if (std::any_of(s.labels.begin(), s.labels.end(), [](int32_t l) { return l != data::kIgnoreIndex; }))
      out.push_back(std::move(s));
  }
  return out;
}

}  // namespace dtr::train
