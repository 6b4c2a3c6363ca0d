// load_tokenizer: the tokenizer kind of a model file (see tokenizer.h).
#include "models/tokenizer/tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "models/formats/gguf.h"
#include "models/formats/mapped_file.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "models/tokenizer/sentencepiece.h"
#include "tensor/error.h"

namespace dtr::tokenizer {

std::string Tokenizer::decode_token_bytes(const std::vector<std::string>& token_bytes,
                                          const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    DTR_CHECK(id >= 0 && static_cast<size_t>(id) < token_bytes.size(), "decode: token id ", id,
              " is outside the vocabulary of ", token_bytes.size());
    if (skip_special && is_special(id)) continue;
    out += token_bytes[static_cast<size_t>(id)];
  }
  return out;
}

std::shared_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  DTR_CHECK(fs::exists(path), "tokenizer: no such file or directory '", path, "'");
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) {
    const auto g = gguf::GGUFFile::open(path);
    const std::string model = g.get_string("tokenizer.ggml.model", "");
    if (model == "gpt2") return std::make_shared<BPETokenizer>(BPETokenizer::from_gguf(g));
    if (model == "llama") return std::make_shared<SentencePieceTokenizer>(SentencePieceTokenizer::from_gguf(g));
    DTR_ERROR(path, ": tokenizer.ggml.model '", model, "' is not supported (gpt2: byte-level BPE, llama: SentencePiece)");
  }
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "tokenizer.json").string() : path;
  DTR_CHECK(fs::exists(file), "tokenizer: '", path,
            "' is neither a .gguf file nor an HF directory with tokenizer.json nor a tokenizer.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file_to_string(file));
  } catch (const nlohmann::json::exception& e) {
    DTR_ERROR(file, ": JSON error: ", e.what());
  }
  const bool byte_fallback = j.is_object() && j.contains("model") && j["model"].is_object() &&
                             j["model"].contains("byte_fallback") && j["model"]["byte_fallback"].is_boolean() &&
                             j["model"]["byte_fallback"].get<bool>();
  if (byte_fallback) return std::make_shared<SentencePieceTokenizer>(SentencePieceTokenizer::from_hf_json(j, file));
  return std::make_shared<BPETokenizer>(BPETokenizer::from_hf_file(file));
}

}  // namespace dtr::tokenizer
