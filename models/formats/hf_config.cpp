#include "models/formats/hf_config.h"

#include <filesystem>

#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/mapped_file.h"
#include "tensor/error.h"

namespace dtr {

using nlohmann::json;

namespace {

int64_t req_int(const json& j, const char* key, const std::string& src) {
  DTR_CHECK(j.contains(key), src, ": missing required key '", key, "'");
  DTR_CHECK(j[key].is_number_integer(), src, ": key '", key, "' must be an integer, got ", j[key].dump());
  return j[key].get<int64_t>();
}
int64_t opt_int(const json& j, const char* key, int64_t def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  DTR_CHECK(j[key].is_number_integer(), src, ": key '", key, "' must be an integer, got ", j[key].dump());
  return j[key].get<int64_t>();
}
double opt_num(const json& j, const char* key, double def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  DTR_CHECK(j[key].is_number(), src, ": key '", key, "' must be a number, got ", j[key].dump());
  return j[key].get<double>();
}
bool opt_bool(const json& j, const char* key, bool def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  DTR_CHECK(j[key].is_boolean(), src, ": key '", key, "' must be true or false, got ", j[key].dump());
  return j[key].get<bool>();
}

}  // namespace

void LlamaConfig::validate(const std::string& src) const {
  auto pos = [&](const char* k, int64_t v) { DTR_CHECK(v > 0, src, ": ", k, " = ", v, " must be positive"); };
  pos("vocab_size", vocab_size);
  pos("hidden_size", hidden_size);
  pos("intermediate_size", intermediate_size);
  pos("num_hidden_layers", num_hidden_layers);
  pos("num_attention_heads", num_attention_heads);
  pos("num_key_value_heads", num_key_value_heads);
  pos("head_dim", head_dim);
  DTR_CHECK(head_dim % 2 == 0, src, ": head_dim = ", head_dim, " must be even for RoPE");
  DTR_CHECK(num_attention_heads % num_key_value_heads == 0, src, ": num_key_value_heads = ", num_key_value_heads,
            " does not divide num_attention_heads = ", num_attention_heads);
  DTR_CHECK(rms_norm_eps > 0, src, ": rms_norm_eps = ", rms_norm_eps, " must be positive");
  DTR_CHECK(rope_theta > 0, src, ": rope_theta = ", rope_theta, " must be positive");
  DTR_CHECK(hidden_act == "silu", src, ": hidden_act = '", hidden_act, "' is not supported (only silu)");
}

LlamaConfig llama_config_from_json(const json& j, const std::string& src) {
  DTR_CHECK(j.is_object(), src, ": config is not a JSON object");
  LlamaConfig c;
  c.vocab_size = req_int(j, "vocab_size", src);
  c.hidden_size = req_int(j, "hidden_size", src);
  c.intermediate_size = req_int(j, "intermediate_size", src);
  c.num_hidden_layers = req_int(j, "num_hidden_layers", src);
  c.num_attention_heads = req_int(j, "num_attention_heads", src);
  c.num_key_value_heads = opt_int(j, "num_key_value_heads", c.num_attention_heads, src);
  DTR_CHECK(c.num_attention_heads > 0, src, ": num_attention_heads = ", c.num_attention_heads, " must be positive");
  c.head_dim = opt_int(j, "head_dim", c.hidden_size / c.num_attention_heads, src);
  if (!j.contains("head_dim"))
    DTR_CHECK(c.hidden_size % c.num_attention_heads == 0, src, ": num_attention_heads = ", c.num_attention_heads,
              " does not divide hidden_size = ", c.hidden_size, " (and there is no head_dim)");
  c.max_position_embeddings = opt_int(j, "max_position_embeddings", c.max_position_embeddings, src);
  c.rope_theta = opt_num(j, "rope_theta", c.rope_theta, src);
  // transformers >= 5 writes the RoPE base under rope_parameters.rope_theta.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    c.rope_theta = opt_num(j["rope_parameters"], "rope_theta", c.rope_theta, src + ": rope_parameters");
  c.rms_norm_eps = opt_num(j, "rms_norm_eps", c.rms_norm_eps, src);
  c.tie_word_embeddings = opt_bool(j, "tie_word_embeddings", c.tie_word_embeddings, src);
  c.attention_bias = opt_bool(j, "attention_bias", false, src);
  c.mlp_bias = opt_bool(j, "mlp_bias", false, src);
  if (j.contains("hidden_act") && j["hidden_act"].is_string()) c.hidden_act = j["hidden_act"].get<std::string>();
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) c.torch_dtype = j["torch_dtype"].get<std::string>();
  c.bos_token_id = opt_int(j, "bos_token_id", -1, src);
  c.pad_token_id = opt_int(j, "pad_token_id", -1, src);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const json& e = j["eos_token_id"];
    if (e.is_array()) {
      for (const auto& x : e) {
        DTR_CHECK(x.is_number_integer(), src, ": key 'eos_token_id' must hold integers, got ", e.dump());
        c.eos_token_ids.push_back(x.get<int64_t>());
      }
    } else {
      c.eos_token_ids.push_back(opt_int(j, "eos_token_id", -1, src));
    }
  }
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const json& r = j["rope_scaling"];
    const char* tk = r.contains("rope_type") ? "rope_type" : "type";
    DTR_CHECK(r.contains(tk) && r[tk].is_string(), src, ": rope_scaling needs a string 'rope_type'");
    c.rope_scaling.rope_type = r[tk].get<std::string>();
    c.rope_scaling.factor = opt_num(r, "factor", 1.0, src + " rope_scaling");
    c.rope_scaling.low_freq_factor = opt_num(r, "low_freq_factor", 1.0, src + " rope_scaling");
    c.rope_scaling.high_freq_factor = opt_num(r, "high_freq_factor", 4.0, src + " rope_scaling");
    c.rope_scaling.original_max_position_embeddings =
        opt_int(r, "original_max_position_embeddings", 0, src + " rope_scaling");
  }
  c.validate(src);
  return c;
}

LlamaConfig load_llama_config(const std::string& path) {
  std::string p = path;
  if (std::filesystem::is_directory(p)) p = (std::filesystem::path(p) / "config.json").string();
  const std::string text = read_file_to_string(p);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    DTR_ERROR(p, ": JSON error at byte ", e.byte, ": ", e.what());
  } catch (const json::exception& e) {  // e.g. out_of_range: a number too large for a double
    DTR_ERROR(p, ": JSON error: ", e.what());
  }
  return llama_config_from_json(j, p);
}

LlamaConfig llama_config_from_gguf(const gguf::GGUFFile& g) {
  const std::string arch = g.get_string("general.architecture", "");
  DTR_CHECK(!arch.empty(), g.path(), ": missing GGUF metadata key 'general.architecture'");
  const std::string p = arch + ".";
  auto req = [&](const std::string& k) {
    (void)g.get(p + k);  // throws naming the key when it is missing
    return g.get_int(p + k, 0);
  };
  LlamaConfig c;
  c.hidden_size = req("embedding_length");
  c.intermediate_size = req("feed_forward_length");
  c.num_hidden_layers = req("block_count");
  c.num_attention_heads = req("attention.head_count");
  c.num_key_value_heads = g.get_int(p + "attention.head_count_kv", c.num_attention_heads);
  DTR_CHECK(c.num_attention_heads > 0, g.path(), ": ", p, "attention.head_count = ", c.num_attention_heads);
  c.head_dim = g.get_int(p + "attention.key_length", g.get_int(p + "rope.dimension_count", c.hidden_size / c.num_attention_heads));
  c.max_position_embeddings = g.get_int(p + "context_length", c.max_position_embeddings);
  c.rope_theta = g.get_float(p + "rope.freq_base", c.rope_theta);
  c.rms_norm_eps = g.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
  if (g.has(p + "vocab_size")) {
    c.vocab_size = g.get_int(p + "vocab_size", 0);
  } else if (g.has("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(g.get("tokenizer.ggml.tokens").as_array().size());
  } else {
    DTR_CHECK(g.has_tensor("token_embd.weight"), g.path(), ": cannot find the vocabulary size (no ", p,
              "vocab_size, tokenizer.ggml.tokens or token_embd.weight)");
    const Shape es = g.tensor_info("token_embd.weight").shape();
    DTR_CHECK(es.size() == 2, g.path(), ": token_embd.weight has shape ", es, " (expected [vocab, hidden])");
    c.vocab_size = es[0];
  }
  c.tie_word_embeddings = !g.has_tensor("output.weight");
  c.attention_bias = g.has_tensor("blk.0.attn_q.bias");
  c.bos_token_id = g.get_int("tokenizer.ggml.bos_token_id", -1);
  if (g.has("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {g.get_int("tokenizer.ggml.eos_token_id", -1)};
  c.pad_token_id = g.get_int("tokenizer.ggml.padding_token_id", -1);
  const std::string st = g.get_string(p + "rope.scaling.type", "");
  if (!st.empty() && st != "none") {
    c.rope_scaling.rope_type = st;
    c.rope_scaling.factor = g.get_float(p + "rope.scaling.factor", 1.0);
    c.rope_scaling.original_max_position_embeddings = g.get_int(p + "rope.scaling.original_context_length", 0);
  }
  c.validate(g.path());
  return c;
}

void llama_config_to_gguf(const LlamaConfig& c, gguf::GGUFWriter& w) {
  DTR_CHECK(!c.mlp_bias, "llama_config_to_gguf: mlp_bias = true has no llama GGUF form");
  using gguf::ValueType;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.vocab_size", static_cast<uint32_t>(c.vocab_size));
  w.add_u32("llama.context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.add_u32("llama.embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.add_u32("llama.block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.add_u32("llama.attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  w.add_f32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  w.add_f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    w.add_u32("llama.attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.add_u32("llama.attention.value_length", static_cast<uint32_t>(c.head_dim));
  }
  if (!c.rope_scaling.rope_type.empty()) {
    w.add_string("llama.rope.scaling.type", c.rope_scaling.rope_type);
    w.add_f32("llama.rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
    if (c.rope_scaling.original_max_position_embeddings > 0)
      w.add_u32("llama.rope.scaling.original_context_length",
                static_cast<uint32_t>(c.rope_scaling.original_max_position_embeddings));
  }
}

json to_json(const LlamaConfig& c) {
  json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rope_theta", c.rope_theta},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"attention_bias", c.attention_bias},
      {"attention_dropout", 0.0},
      {"mlp_bias", c.mlp_bias},
      {"hidden_act", c.hidden_act},
      {"initializer_range", 0.02},
      {"pretraining_tp", 1},
      {"use_cache", true},
      {"torch_dtype", c.torch_dtype},
  };
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (c.eos_token_ids.empty()) j["eos_token_id"] = nullptr;
  else j["eos_token_id"] = c.eos_token_ids;
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
  if (c.rope_scaling.rope_type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    json r = {{"rope_type", c.rope_scaling.rope_type}, {"factor", c.rope_scaling.factor}};
    if (c.rope_scaling.rope_type == "llama3") {
      r["low_freq_factor"] = c.rope_scaling.low_freq_factor;
      r["high_freq_factor"] = c.rope_scaling.high_freq_factor;
    }
    if (c.rope_scaling.original_max_position_embeddings > 0)
      r["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    j["rope_scaling"] = r;
  }
  return j;
}

void save_llama_config(const LlamaConfig& c, const std::string& path) {
  const std::string s = to_json(c).dump(2) + "\n";
  AtomicFileWriter w(path);
  w.write(s.data(), s.size());
  w.commit();
}

}  // namespace dtr
