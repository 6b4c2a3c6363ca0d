#include "models/formats/hf_config.h"

#include <filesystem>

#include "models/formats/gguf.h"
#include "models/formats/gguf_writer.h"
#include "models/formats/json_keys.h"
#include "models/formats/mapped_file.h"
#include "models/transformer/family.h"
#include "tensor/error.h"

namespace dtr {

using nlohmann::json;

using namespace json_keys;

bool ModelConfig::is_sliding(int64_t i) const {
  return i >= 0 && i < static_cast<int64_t>(layer_types.size()) && layer_types[i] == "sliding_attention";
}

bool ModelConfig::is_moe_layer(int64_t i) const {
  if (num_experts <= 0) return false;
  for (int64_t l : mlp_only_layers)
    if (l == i) return false;
  return decoder_sparse_step > 0 && (i + 1) % decoder_sparse_step == 0;
}

void ModelConfig::validate(const std::string& src) const {
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
  DTR_CHECK(hidden_act == "silu" || hidden_act == "gelu_pytorch_tanh", src, ": hidden_act = '", hidden_act,
            "' is not supported (silu, gelu_pytorch_tanh)");
  DTR_CHECK(layer_types.empty() || static_cast<int64_t>(layer_types.size()) == num_hidden_layers, src,
            ": layer_types has ", layer_types.size(), " entries but num_hidden_layers = ", num_hidden_layers);
  bool sliding = false;
  for (const auto& t : layer_types) {
    DTR_CHECK(t == "full_attention" || t == "sliding_attention", src, ": layer_types entry '", t,
              "' is not supported (full_attention, sliding_attention)");
    sliding = sliding || t == "sliding_attention";
  }
  DTR_CHECK(sliding_window >= 0, src, ": sliding_window = ", sliding_window, " must not be negative");
  if (num_experts > 0) {
    DTR_CHECK(num_experts_per_tok >= 1 && num_experts_per_tok <= num_experts, src, ": num_experts_per_tok = ",
              num_experts_per_tok, " must be in [1, num_experts = ", num_experts, "]");
    pos("moe_intermediate_size", moe_intermediate_size);
    pos("decoder_sparse_step", decoder_sparse_step);
    DTR_CHECK(hidden_act == "silu", src, ": hidden_act = '", hidden_act, "' for experts (only silu is built)");
  }
  DTR_CHECK(!sliding || sliding_window > 0, src, ": layer_types has sliding_attention layers but sliding_window = ",
            sliding_window);
  DTR_CHECK(!sliding || rope_local_base_freq > 0, src, ": rope_local_base_freq = ", rope_local_base_freq,
            " must be positive");
  DTR_CHECK(query_pre_attn_scalar >= 0, src, ": query_pre_attn_scalar = ", query_pre_attn_scalar,
            " must not be negative");
  DTR_CHECK(final_logit_softcapping >= 0, src, ": final_logit_softcapping = ", final_logit_softcapping,
            " must not be negative");
  DTR_CHECK(attn_logit_softcapping == 0, src, ": attn_logit_softcapping = ", attn_logit_softcapping,
            " is not supported yet (attention logit soft-capping is not built)");
}

ModelConfig model_config_from_json(const json& j, const std::string& src) {
  DTR_CHECK(j.is_object(), src, ": config is not a JSON object");
  ModelConfig c;
  c.model_type = opt_str(j, "model_type", "llama", src);
  const ModelFamily& fam = model_family(c.model_type, src);
  c.vocab_size = req_int(j, "vocab_size", src);
  c.hidden_size = req_int(j, "hidden_size", src);
  c.intermediate_size = req_int(j, "intermediate_size", src);
  c.num_hidden_layers = req_int(j, "num_hidden_layers", src);
  c.num_attention_heads = req_int(j, "num_attention_heads", src);
  c.num_key_value_heads = opt_int(j, "num_key_value_heads", c.num_attention_heads, src);
  DTR_CHECK(c.num_attention_heads > 0, src, ": num_attention_heads = ", c.num_attention_heads, " must be positive");
  c.head_dim = opt_int(j, "head_dim", 0, src);
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
  if (j.contains("dtype") && j["dtype"].is_string()) c.torch_dtype = j["dtype"].get<std::string>();  // transformers >= 5
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
  // rope_scaling; transformers >= 5 folds it into rope_parameters (rope_type other than "default").
  const json* rs = nullptr;
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rs = &j["rope_scaling"];
  else if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
           opt_str(j["rope_parameters"], "rope_type", "default", src + ": rope_parameters") != "default")
    rs = &j["rope_parameters"];
  if (rs) {
    const json& r = *rs;
    const char* tk = r.contains("rope_type") ? "rope_type" : "type";
    DTR_CHECK(r.contains(tk) && r[tk].is_string(), src, ": rope_scaling needs a string 'rope_type'");
    c.rope_scaling.rope_type = r[tk].get<std::string>();
    c.rope_scaling.factor = opt_num(r, "factor", 1.0, src + " rope_scaling");
    c.rope_scaling.low_freq_factor = opt_num(r, "low_freq_factor", 1.0, src + " rope_scaling");
    c.rope_scaling.high_freq_factor = opt_num(r, "high_freq_factor", 4.0, src + " rope_scaling");
    c.rope_scaling.original_max_position_embeddings =
        opt_int(r, "original_max_position_embeddings", 0, src + " rope_scaling");
  }
  c.sliding_window = opt_int(j, "sliding_window", 0, src);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    DTR_CHECK(j["layer_types"].is_array(), src, ": key 'layer_types' must be a list, got ", j["layer_types"].dump());
    for (const auto& t : j["layer_types"]) {
      DTR_CHECK(t.is_string(), src, ": key 'layer_types' must hold strings, got ", j["layer_types"].dump());
      c.layer_types.push_back(t.get<std::string>());
    }
  }
  if (fam.read_json) fam.read_json(j, c, src);
  if (c.head_dim == 0) {
    DTR_CHECK(c.hidden_size % c.num_attention_heads == 0, src, ": num_attention_heads = ", c.num_attention_heads,
              " does not divide hidden_size = ", c.hidden_size, " (and there is no head_dim)");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.validate(src);
  return c;
}

ModelConfig load_model_config(const std::string& path) {
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
  return model_config_from_json(j, p);
}

ModelConfig model_config_from_gguf(const gguf::GGUFFile& g) {
  const std::string arch = g.get_string("general.architecture", "");
  DTR_CHECK(!arch.empty(), g.path(), ": missing GGUF metadata key 'general.architecture'");
  const ModelFamily* fam = model_family_for_gguf(g, arch);
  DTR_CHECK(fam != nullptr, g.path(), ": GGUF architecture '", arch, "' is not supported (supported model types: ",
            supported_model_types(), ")");
  const std::string p = arch + ".";
  auto req = [&](const std::string& k) {
    (void)g.get(p + k);  // throws naming the key when it is missing
    return g.get_int(p + k, 0);
  };
  ModelConfig c;
  c.model_type = fam->model_type;
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
  c.sliding_window = g.get_int(p + "attention.sliding_window", 0);
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
  if (fam->read_gguf) fam->read_gguf(g, p, c);
  c.validate(g.path());
  return c;
}

void model_config_to_gguf(const ModelConfig& c, gguf::GGUFWriter& w) {
  const ModelFamily& fam = model_family(c.model_type);
  const std::string p = fam.gguf_architecture + ".";
  w.add_string("general.architecture", fam.gguf_architecture);
  w.add_u32(p + "vocab_size", static_cast<uint32_t>(c.vocab_size));
  w.add_u32(p + "context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.add_u32(p + "embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.add_u32(p + "feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.add_u32(p + "block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.add_u32(p + "attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.add_u32(p + "attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  w.add_f32(p + "rope.freq_base", static_cast<float>(c.rope_theta));
  w.add_f32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.add_u32(p + "rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    w.add_u32(p + "attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.add_u32(p + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  }
  if (c.sliding_window > 0) w.add_u32(p + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
  if (!c.rope_scaling.rope_type.empty()) {
    w.add_string(p + "rope.scaling.type", c.rope_scaling.rope_type);
    w.add_f32(p + "rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
    if (c.rope_scaling.original_max_position_embeddings > 0)
      w.add_u32(p + "rope.scaling.original_context_length",
                static_cast<uint32_t>(c.rope_scaling.original_max_position_embeddings));
  }
  if (fam.write_gguf) fam.write_gguf(c, p, w);
}

json to_json(const ModelConfig& c) {
  const ModelFamily& fam = model_family(c.model_type);
  json j = {
      {"architectures", {fam.class_prefix + "ForCausalLM"}},
      {"model_type", c.model_type},
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
      {"attention_dropout", 0.0},
      {"hidden_act", c.hidden_act},
      {"initializer_range", 0.02},
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
  if (fam.write_json) fam.write_json(c, j);
  return j;
}

void save_model_config(const ModelConfig& c, const std::string& path) {
  const std::string s = to_json(c).dump(2) + "\n";
  AtomicFileWriter w(path);
  w.write(s.data(), s.size());
  w.commit();
}

}  // namespace dtr
