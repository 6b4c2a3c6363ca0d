// dtr-convert hf-to-gguf: Hugging Face model directory -> GGUF (see convert.h).
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "models/formats/gguf_writer.h"
#include "models/formats/hf_config.h"
#include "models/transformer/gguf_names.h"
#include "models/formats/qk_permute.h"
#include "models/formats/sharded_checkpoint.h"
#include "models/transformer/convert.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "tensor/error.h"

namespace dtr {

namespace fs = std::filesystem;
using nlohmann::json;

GGUFOutType parse_gguf_outtype(const std::string& s) {
  if (s == "f32") return GGUFOutType::f32;
  if (s == "f16") return GGUFOutType::f16;
  if (s == "bf16") return GGUFOutType::bf16;
  DTR_ERROR("GGUF output type '", s, "' is not supported (f32, f16, bf16; quantised types are not written)");
}

namespace {

// llama.cpp's general.file_type (enum llama_ftype): ALL_F32, MOSTLY_F16, MOSTLY_BF16.
uint32_t file_type(GGUFOutType t) { return t == GGUFOutType::f32 ? 0 : t == GGUFOutType::f16 ? 1 : 32; }

gguf::GGMLType ggml_type(GGUFOutType t) {
  return t == GGUFOutType::f32 ? gguf::GGMLType::F32 : t == GGUFOutType::f16 ? gguf::GGMLType::F16 : gguf::GGMLType::BF16;
}

json read_json(const fs::path& p) {
  try {
    return json::parse(read_file_to_string(p.string()));
  } catch (const json::parse_error& e) {
    DTR_ERROR(p.string(), ": JSON error at byte ", e.byte, ": ", e.what());
  } catch (const json::exception& e) {  // e.g. out_of_range: a number too large for a double
    DTR_ERROR(p.string(), ": JSON error: ", e.what());
  }
}

// Token text of a tokenizer_config.json entry ("<s>" or {"content": "<s>", ...}).
std::string token_text(const json& t) {
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return "";
}

// The tokenizer of an HF directory with bos / eos / pad completed from tokenizer_config.json and
// config.json, and its chat template.
tokenizer::BPETokenizer load_tokenizer(const fs::path& dir, const ModelConfig& c, std::string& chat_template) {
  const fs::path tj = dir / "tokenizer.json";
  DTR_CHECK(fs::exists(tj), dir.string(), ": no tokenizer.json (a GGUF needs the tokenizer)");
  auto tok = tokenizer::BPETokenizer::from_hf_file(tj.string());
  tokenizer::BPEVocab v = tok.vocab();
  const fs::path tc = dir / "tokenizer_config.json";
  json cfg = json::object();
  if (fs::exists(tc)) cfg = read_json(tc);
  if (cfg.is_object() && cfg.contains("chat_template")) {
    const json& t = cfg["chat_template"];
    if (t.is_string()) {
      chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const auto& e : t)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          chat_template = e["template"].get<std::string>();
    }
  }
  if (chat_template.empty() && fs::exists(dir / "chat_template.jinja"))
    chat_template = read_file_to_string((dir / "chat_template.jinja").string());
  const auto n = static_cast<int64_t>(v.tokens.size());
  auto valid = [&](int64_t id) { return id >= 0 && id < n ? static_cast<int32_t>(id) : int32_t{-1}; };
  if (v.pad_id < 0 && cfg.is_object() && cfg.contains("pad_token")) v.pad_id = tok.token_to_id(token_text(cfg["pad_token"]));
  if (v.pad_id < 0) v.pad_id = valid(c.pad_token_id);
  if (v.bos_id < 0) v.bos_id = valid(c.bos_token_id);
  if (v.eos_id < 0) v.eos_id = valid(c.eos_token_id());
  return tokenizer::BPETokenizer(std::move(v));
}

// Sort key: token_embd, the blocks in layer order, output_norm, output.
std::pair<int64_t, std::string> tensor_order(const std::string& gguf_name) {
  if (gguf_name.rfind("token_embd", 0) == 0) return {-1, gguf_name};
  if (gguf_name.rfind("blk.", 0) == 0) return {std::stoll(gguf_name.substr(4)), gguf_name};
  return {INT64_MAX, gguf_name};
}

}  // namespace

void add_gguf_model_tensors(gguf::GGUFWriter& w, const ModelConfig& c, safetensors::TensorMap sd, GGUFOutType outtype,
                            const std::string& hf_dir) {
  // (key, hf name, part): a joined HF tensor (experts' gate_up_proj) is written as its parts.
  std::vector<std::tuple<std::pair<int64_t, std::string>, std::string, int64_t>> order;
  std::map<std::string, int64_t> parts_left;
  for (const auto& [hf, t] : sd) {
    if (hf.ends_with("rotary_emb.inv_freq")) continue;
    if (hf == "lm_head.weight" && c.tie_word_embeddings) continue;  // tied: token_embd only
    const auto names = hf_to_gguf_names(hf, c.model_type);
    DTR_CHECK(!names.empty(), hf_dir, ": tensor '", hf, "' is not a ", c.model_type, " weight (no GGUF name)");
    const Shape want = expected_shape(hf, c);
    DTR_CHECK(t.sizes() == want, hf_dir, ": tensor '", hf, "' has shape ", t.sizes(), " but config.json needs ", want);
    for (size_t k = 0; k < names.size(); ++k) order.emplace_back(tensor_order(names[k]), hf, static_cast<int64_t>(k));
    parts_left[hf] = static_cast<int64_t>(names.size());
  }
  for (const auto& hf : required_tensor_names(c)) DTR_CHECK(sd.count(hf), hf_dir, ": missing tensor '", hf, "'");

  std::sort(order.begin(), order.end());
  for (const auto& [key, hf, part] : order) {
    Tensor t = sd.at(hf);
    const int64_t nparts = static_cast<int64_t>(hf_to_gguf_names(hf, c.model_type).size());
    if (nparts > 1) {  // slice `part` of the second-to-last dim
      const int64_t d = t.dim() - 2, n = t.sizes()[static_cast<size_t>(d)] / nparts;
      t = t.narrow(d, part * n, n);
    }
    const Shape shape = t.sizes();
    std::vector<float> v = t.to(DType::f32).contiguous().to_vector<float>();
    if (const int64_t heads = qk_permute_heads(hf, c)) v = permute_qk(v, shape[0], shape.size() > 1 ? shape[1] : 1, heads);
    if (const double shift = gguf_value_shift(hf, c); shift != 0)  // Gemma: llama.cpp stores 1 + norm weight
      for (float& x : v) x += static_cast<float>(shift);
    // llama.cpp keeps 1-D tensors (norms, biases) and the MoE router (ffn_gate_inp) in F32
    // whatever the output type.
    const bool f32 = shape.size() <= 1 || key.second.ends_with("ffn_gate_inp.weight");
    const gguf::GGMLType type = f32 ? gguf::GGMLType::F32 : ggml_type(outtype);
    w.add_f32_tensor(key.second, shape, v, type);
    if (--parts_left[hf] == 0) sd.erase(hf);  // release the map view / copy early
  }
}

void convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path, GGUFOutType outtype) {
  const fs::path dir(hf_dir);
  const ModelConfig c = load_model_config(hf_dir);
  std::string chat_template;
  const auto tok = load_tokenizer(dir, c, chat_template);

  gguf::GGUFWriter w;
  model_config_to_gguf(c, w);
  const fs::path norm = fs::absolute(dir).lexically_normal();
  w.add_string("general.name", (norm.has_filename() ? norm : norm.parent_path()).filename().string());
  w.add_u32("general.file_type", file_type(outtype));
  tokenizer::add_gguf_tokenizer(w, tok, chat_template, c.vocab_size);

  add_gguf_model_tensors(w, c, safetensors::load_checkpoint(hf_dir, safetensors::LoadMode::view), outtype, hf_dir);
  fs::create_directories(fs::absolute(fs::path(out_path)).parent_path());
  w.write(out_path);
}

}  // namespace dtr
