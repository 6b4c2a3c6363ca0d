#include "models/transformer/convert.h"

#include <filesystem>

#include "models/formats/gguf.h"
#include "models/transformer/load.h"
#include "models/lora/peft.h"
#include "models/tokenizer/bpe_tokenizer.h"

namespace dtr {

TokenizerFiles convert_gguf_to_hf(const std::string& gguf_path, const std::string& out_dir) {
  auto model = load_model_gguf(gguf_path);
  save_model_hf(*model, out_dir);
  return save_base_tokenizer(gguf_path, out_dir);
}

TokenizerFiles save_base_tokenizer(const std::string& base, const std::string& out_dir) {
  namespace fs = std::filesystem;
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".gguf") == 0) {
    const auto g = gguf::GGUFFile::open(base);
    if (!g.has("tokenizer.ggml.tokens")) return {false, "the GGUF holds no tokenizer (no tokenizer.ggml.tokens)"};
    // Byte-level BPE ("gpt2") only: a SentencePiece vocabulary ("llama", Gemma) has no
    // tokenizer.json writer (transformers loads it from the GGUF: from_pretrained(gguf_file=...)).
    const std::string model = g.get_string("tokenizer.ggml.model", "");
    if (model == "llama")
      return {false, "SentencePiece vocabulary (tokenizer.ggml.model 'llama'), which dtr cannot write as "
                     "tokenizer.json; load it from the GGUF (transformers: from_pretrained(..., gguf_file=...))"};
    if (model != "gpt2")
      return {false, "tokenizer.ggml.model '" + model + "': dtr writes tokenizer.json for byte-level BPE ('gpt2') only"};
    const auto tok = tokenizer::BPETokenizer::from_gguf(g);
    const std::string tmpl = g.has("tokenizer.chat_template") ? g.get("tokenizer.chat_template").as_string() : "";
    tokenizer::save_hf_tokenizer(tok, out_dir, tmpl);
    return {true, ""};
  }
  bool any = false;
  fs::create_directories(out_dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"}) {
    const fs::path src = fs::path(base) / f;
    if (!fs::exists(src)) continue;
    fs::copy_file(src, fs::path(out_dir) / f, fs::copy_options::overwrite_existing);
    any = true;
  }
  if (any) return {true, ""};
  return {false, base + " has no tokenizer.json, tokenizer_config.json, special_tokens_map.json or chat_template.jinja"};
}

std::vector<std::string> merge_adapter_to_hf(const std::string& base, const std::string& adapter_dir,
                                             const std::string& out_dir) {
  auto model = load_model(base);
  auto adapted = load_peft_adapter(*model, adapter_dir);
  save_merged_model(*model, out_dir);
  save_base_tokenizer(base, out_dir);
  return adapted;
}

}  // namespace dtr
