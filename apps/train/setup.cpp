#include "apps/train/setup.h"

#include "parallel/pipeline/stage_split.h"

#include "apps/train/instruction_data.h"
#include "apps/train/progress.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/train/instruction_data.h"
#include "models/data/chat_dataset.h"
#include "models/data/packing.h"
#include "models/data/text_dataset.h"
#include "models/data/token_shards.h"
#include "models/formats/gguf.h"
#include "models/transformer/load.h"
#include "models/transformer/memory_plan.h"
#include "models/transformer/meta_load.h"
#include "models/transformer/parallelizer.h"
#include "models/lora/inject.h"
#include "models/tokenizer/bpe_tokenizer.h"
#include "models/tokenizer/tokenizer.h"
#include "models/tokenizer/chat_template.h"
#include "runtime/env.h"
#include "tensor/error.h"
#include "tensor/meta.h"
#include "tensor/random.h"

namespace fs = std::filesystem;

namespace dtr::train {
namespace {

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

/// YAML scalar -> JSON with the natural type (int, float, bool, string); maps and lists recurse.
nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& e : n) j.push_back(yaml_to_json(e));
    return j;
  }
  if (n.IsNull()) return nullptr;
  const std::string s = n.as<std::string>();
  try {
    size_t pos = 0;
    const long long v = std::stoll(s, &pos);
    if (pos == s.size()) return v;
  } catch (...) {
  }
  try {
    size_t pos = 0;
    const double v = std::stod(s, &pos);
    if (pos == s.size()) return v;
  } catch (...) {
  }
  if (s == "true") return true;
  if (s == "false") return false;
  return s;
}

LlamaConfig resolve_config(const Recipe& r, std::string& source) {
  if (!r.model.random()) {
    source = "model.path=" + r.model.path;
    DTR_CHECK(fs::exists(r.model.path), "model.path: no such file or directory '", r.model.path, "' (",
              r.source_of("model.path"), "); scripts/fetch-model.sh downloads the default model");
    if (ends_with(r.model.path, ".gguf")) return model_config_from_gguf(gguf::GGUFFile::open(r.model.path));
    DTR_CHECK(!fs::is_directory(r.model.path) || fs::exists(fs::path(r.model.path) / "config.json"), "model.path: '",
              r.model.path, "' is a directory without config.json (expected a .gguf file or a Hugging Face model "
              "directory; ", r.source_of("model.path"), ")");
    DTR_CHECK(fs::is_directory(r.model.path) || ends_with(r.model.path, ".json"), "model.path: '", r.model.path,
              "' is neither a .gguf file nor a Hugging Face model directory (", r.source_of("model.path"), ")");
    return load_model_config(r.model.path);
  }
  if (r.model.config_name == "debug") {
    source = "model.config=debug";
    return llama_debug_config();
  }
  if (!r.model.config_name.empty()) {  // a built-in shape for planning (memory_plan.h)
    source = "model.config=" + r.model.config_name;
    return builtin_model_config(r.model.config_name);
  }
  source = "model.config (" + r.source_of("model.config") + ")";
  nlohmann::json j = yaml_to_json(r.model.config);
  LlamaConfig c = model_config_from_json(j, "model.config (" + r.source_of("model.config") + ")");
  c.validate("model.config");
  return c;
}

}  // namespace

LoraConfig lora_config(const Recipe& r) {
  LoraConfig lc;
  lc.target_modules = r.peft.target_modules;
  lc.exclude_modules = r.peft.exclude_modules;
  lc.options.r = r.peft.dim;
  lc.options.alpha = r.peft.alpha;
  lc.options.dropout = r.peft.dropout;
  lc.options.dropout_position =
      r.peft.dropout_position == "pre" ? nn::LoraDropoutPosition::pre : nn::LoraDropoutPosition::post;
  lc.options.use_rslora = r.peft.use_rslora;
  return lc;
}

int64_t llama_param_count(const LlamaConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, hd = llama_head_dim(c);
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads > 0 ? c.num_key_value_heads : nh;
  const int64_t attention = H * nh * hd + 2 * H * nkv * hd + nh * hd * H + 2 * H + (c.qk_norm ? 2 * hd : 0);
  // MoE layers: router [E, H] + E experts' gate, up, down [moe_I, H] (all of them: stored)
  const int64_t moe_mlp = H * c.num_experts + c.num_experts * 3 * H * c.moe_intermediate_size;
  int64_t n = V * H + H + (c.tie_word_embeddings ? 0 : V * H);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) n += attention + (c.is_moe_layer(l) ? moe_mlp : 3 * H * I);
  return n;
}

/// Whether peft's target / exclude patterns select module `fqn` (apply_lora's rule).
static bool peft_targets(const PeftRecipe& peft, const std::string& fqn) {
  bool hit = false, ex = false;
  for (const auto& t : peft.target_modules) hit = hit || lora_pattern_matches(t, fqn);
  for (const auto& e : peft.exclude_modules) ex = ex || lora_pattern_matches(e, fqn);
  return hit && !ex;
}

int64_t lora_param_count(const LlamaConfig& c, const PeftRecipe& peft) {
  if (!peft.enabled) return 0;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, hd = llama_head_dim(c);
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads > 0 ? c.num_key_value_heads : nh;
  struct Lin {
    std::string name;
    int64_t in, out;
  };
  std::vector<Lin> lins;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    lins.push_back({p + "self_attn.q_proj", H, nh * hd});
    lins.push_back({p + "self_attn.k_proj", H, nkv * hd});
    lins.push_back({p + "self_attn.v_proj", H, nkv * hd});
    lins.push_back({p + "self_attn.o_proj", nh * hd, H});
    if (c.is_moe_layer(l)) {  // grouped experts: E adapter pairs on gate_up (H -> 2I) and down (I -> H)
      const int64_t Ie = c.moe_intermediate_size;
      lins.push_back({p + "mlp.experts", c.num_experts * (H + 2 * Ie), c.num_experts * (Ie + H)});
      continue;
    }
    lins.push_back({p + "mlp.gate_proj", H, I});
    lins.push_back({p + "mlp.up_proj", H, I});
    lins.push_back({p + "mlp.down_proj", I, H});
  }
  if (!c.tie_word_embeddings) lins.push_back({"lm_head", H, V});
  int64_t n = 0;
  for (const auto& L : lins) {
    if (peft_targets(peft, L.name)) n += peft.dim * (L.in + L.out);
  }
  return n;
}

Plan make_plan(const Recipe& r, int world) {
  DTR_CHECK(r.model.device != "cuda" || cuda_device() >= 0, "model.device=cuda: no CUDA device visible to rank ",
            dtr::rank(),
#ifdef DTR_WITH_CUDA
            " (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES hides them)"
#else
            " (dtr was built without CUDA: configure with -DDTR_CUDA=ON)"
#endif
            ", use model.device: cpu");
  Plan p;
  p.config = resolve_config(r, p.model_source);
  p.mesh = parse_distributed(r.distributed, world, [&](const std::string& k) {
    return r.source_of(k.empty() ? "distributed" : "distributed." + k) + ": distributed";
  });
  const int64_t tp = p.mesh.tp_size;
  const auto& c = p.config;
  check_tp_heads(c, tp, p.model_source);
  DTR_CHECK(p.mesh.ep_size == 1 || c.num_experts > 0, "distributed.ep_size=", p.mesh.ep_size, ": ", p.model_source,
            " has no MoE block (expert parallelism needs a MoE family: qwen3_moe, mixtral)");
  DTR_CHECK(c.num_experts == 0 || c.num_experts % p.mesh.ep_size == 0, "distributed.ep_size=", p.mesh.ep_size,
            " does not divide num_experts=", c.num_experts, " (", p.model_source, ")");
  DTR_CHECK(c.num_experts == 0 || c.router_aux_loss_coef == 0 || !p.mesh.activation_checkpointing,
            "distributed.activation_checkpointing=",
            p.mesh.activation_checkpointing ? checkpoint_policy_name(*p.mesh.activation_checkpointing) : "none",
            " with router_aux_loss_coef=",
            c.router_aux_loss_coef, ": the MoE load-balancing loss under activation checkpointing is not built (",
            p.model_source, "; use activation_checkpointing: none, or router_aux_loss_coef: 0)");
  p.dp_size = p.mesh.dp_size;
  const auto& st = r.step_scheduler;
  const int64_t per_step = st.local_batch_size * p.dp_size;
  DTR_CHECK(st.global_batch_size % per_step == 0, "step_scheduler.global_batch_size=", st.global_batch_size,
            " is not divisible by step_scheduler.local_batch_size=", st.local_batch_size, " x dp_size=", p.dp_size,
            " (= ", per_step, "); gradient accumulation must be a whole number (", r.source_of("step_scheduler"), ")");
  p.grad_accum = st.global_batch_size / per_step;
  // Pipeline parallelism: the step's rows (grad_accum x local_batch_size per dp rank) go through
  // the schedule as micro-batches of pp_microbatch_size rows (default local_batch_size).
  const PipelineConfig& pc = p.mesh.pipeline;
  p.pp_microbatch_rows = pc.microbatch_size > 0 ? pc.microbatch_size : st.local_batch_size;
  if (p.mesh.pp_size > 1) {
    DTR_CHECK(r.dataset.packed_sequence_size == 0, "dataset.packed_sequence_size=", r.dataset.packed_sequence_size,
              " with distributed.pp_size=", p.mesh.pp_size,
              ": packed rows under pipeline parallelism are not built in dtr (use one of them)");
    DTR_CHECK(st.local_batch_size % p.pp_microbatch_rows == 0, "distributed.pipeline.pp_microbatch_size=",
              p.pp_microbatch_rows, " does not divide step_scheduler.local_batch_size=", st.local_batch_size);
    DTR_CHECK(c.num_experts == 0, "distributed.pp_size=", p.mesh.pp_size,
              ": pipeline parallelism with MoE families is not built in dtr (", p.model_source, ")");
    const int v = pc.stages_per_rank(c.num_hidden_layers, p.mesh.pp_size, "distributed.pipeline");
    (void)split_layers(c.num_hidden_layers, static_cast<int>(p.mesh.pp_size) * v, pc.layer_counts,
                       "distributed.pipeline.layers_per_stage");
    const int64_t m = p.grad_accum * st.local_batch_size / p.pp_microbatch_rows;
    if (pc.schedule == PipelineScheduleKind::Interleaved1F1B)
      DTR_CHECK(m % p.mesh.pp_size == 0, "distributed.pipeline: interleaved1f1b needs the micro-batches per step (",
                m, " = global_batch_size / dp_size / pp_microbatch_size) to be a multiple of pp_size=", p.mesh.pp_size);
  }
  const int64_t max_pos = c.max_position_embeddings;
  DTR_CHECK(r.dataset.seq_len <= max_pos, "dataset.seq_len=", r.dataset.seq_len,
            " exceeds the model's max_position_embeddings=", max_pos, " (", p.model_source, ")");
  // Context parallelism cuts every row into 2 cp equal chunks (batches are padded to a multiple of
  // 2 cp; seq_len caps that padding, so it must be one too).
  const int64_t cp = p.mesh.cp_size;
  for (const DatasetRecipe* d : {&r.dataset, &r.validation_dataset})
    DTR_CHECK(cp == 1 || (d != &r.dataset && !d->enabled) || d->seq_len % (2 * cp) == 0, d == &r.dataset ? "dataset" : "validation_dataset",
              ".seq_len=", d->seq_len, " is not divisible by 2 * distributed.cp_size = ", 2 * cp,
              " (context parallelism splits each sequence into 2 cp chunks)");
  DTR_CHECK(cp == 1 || r.dataset.packed_sequence_size % (2 * cp) == 0, "dataset.packed_sequence_size=",
            r.dataset.packed_sequence_size, " is not divisible by 2 * distributed.cp_size = ", 2 * cp,
            " (context parallelism splits each packed row into 2 cp chunks)");
  DTR_CHECK(r.dataset.packed_sequence_size <= max_pos, "dataset.packed_sequence_size=", r.dataset.packed_sequence_size,
            " exceeds the model's max_position_embeddings=", max_pos, " (", p.model_source, ")");
  if (r.peft.enabled && r.peft.dim > c.hidden_size)
    DTR_ERROR("peft.dim=", r.peft.dim, " exceeds hidden_size=", c.hidden_size, " (", p.model_source, ")");
  const int64_t lora = lora_param_count(c, r.peft);
  if (r.peft.enabled)
    DTR_CHECK(lora > 0, "peft.target_modules [", [&] {
      std::string s;
      for (const auto& t : r.peft.target_modules) s += (s.empty() ? "" : ", ") + t;
      return s;
    }(), "] match no Linear module of the model (nor its MoE experts: \"*.mlp.experts\"; ", r.source_of("peft"), ")");
  if (r.peft.enabled && r.peft.dropout > 0)
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string e = "model.layers." + std::to_string(l) + ".mlp.experts";
      DTR_CHECK(!c.is_moe_layer(l) || !peft_targets(r.peft, e), "peft.dropout=", r.peft.dropout, ": LoRA dropout on MoE experts (", e,
                ") is not built; use 0 or leave the experts out of peft.target_modules (", r.source_of("peft"), ")");
    }
  p.total_params = llama_param_count(c) + lora;
  p.trainable_params = r.peft.enabled ? lora : p.total_params;
  p.memory = plan_step_memory(r, p);
  p.memory_estimate_bytes = p.memory.peak_bytes;
  return p;
}

MemoryPlan plan_step_memory(const Recipe& r, const Plan& p) {
  const DType dt = r.model.dtype == "bf16" ? DType::bf16 : DType::f32;
  MetaInitGuard meta;  // shapes only: any model size plans in a few MB
  CausalLM m(p.config, dt, /*init=*/false);
  if (r.peft.enabled) apply_lora(m, lora_config(r));
  StepShape st;
  st.local_batch = r.step_scheduler.local_batch_size;
  st.seq_len = r.dataset.seq_len;
  st.grad_accum = p.grad_accum;
  st.from_file = !r.model.path.empty();
  return plan_memory(m, p.mesh, st, dt);
}

std::string dry_run_report(const Recipe& r, const Plan& p) {
  std::ostringstream o;
  o << "# resolved recipe (" << r.file << ")\n" << dump_recipe(r) << "\n\n";
  const auto& c = p.config;
  o << "model:  " << p.model_source << ": layers " << c.num_hidden_layers << ", hidden " << c.hidden_size
    << ", intermediate " << c.intermediate_size << ", heads " << c.num_attention_heads << "/"
    << (c.num_key_value_heads ? c.num_key_value_heads : c.num_attention_heads) << ", vocab " << c.vocab_size
    << (c.tie_word_embeddings ? ", tied embeddings" : "") << ", dtype " << r.model.dtype << "\n";
  o << "mesh:   " << p.mesh.str() << "\n";
  o << "batch:  global " << r.step_scheduler.global_batch_size << " = local " << r.step_scheduler.local_batch_size
    << " x dp " << p.dp_size << " x grad accumulation " << p.grad_accum << ", seq_len " << r.dataset.seq_len << "\n";
  o << strformat("params: trainable %lld / total %lld (%.3f%%)\n", (long long)p.trainable_params,
                 (long long)p.total_params, 100.0 * static_cast<double>(p.trainable_params) / p.total_params);
  o << p.memory.str();
  // The formulas the plan is checked against (tests/models/test_memory_plan.cpp).
  const double world = static_cast<double>(p.mesh.world_size);
  o << "formulas: ZeRO-3 mixed-precision AdamW 16 x params / N = "
    << format_bytes(16.0 * static_cast<double>(p.total_params) / world)
    << "; Megatron no-AC activations (16-bit GPT layers) s b h (10 + 24 / t + 5 a s / (h t)) x layers = "
    << format_bytes(megatron_activation_bytes(r.dataset.seq_len, r.step_scheduler.local_batch_size, c.hidden_size,
                                              c.num_attention_heads, p.mesh.tp_size, p.mesh.sequence_parallel) *
                    static_cast<double>(c.num_hidden_layers))
    << "\n";
  return o.str();
}

std::vector<data::Sample> load_samples(const Recipe& r, const DatasetRecipe& d, const std::string& name,
                                       int32_t* pad_id) {
  int32_t pad = 0;
  for (const auto& f : d.paths) {
    DTR_CHECK(fs::exists(f), name, ".path: no such file '", f, "' (", r.source_of(name + ".path"),
              "); scripts/fetch-data.sh builds the default data");
    DTR_CHECK(!fs::is_directory(f), name, ".path: '", f, "' is a directory, expected a ", d.type, " file (",
              r.source_of(name + ".path"), ")");
  }
  std::vector<data::Sample> out;
  if (d.type == "token_shards") {
    auto ds = data::load_token_shard_dataset(d.paths, d.seq_len);
    for (int64_t i = 0; i < ds.size(); ++i) out.push_back(ds.get(i));
  } else {
    const std::string tok_path = d.tokenizer.empty() ? r.model.path : d.tokenizer;
    if (tok_path == "bytes") {
      DTR_CHECK(d.type == "text", name, ".tokenizer: 'bytes' works with type text only");
      std::vector<int32_t> stream;
      for (const auto& f : d.paths) {
        std::ifstream in(f, std::ios::binary);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        for (unsigned char ch : text) stream.push_back(ch);
        stream.push_back(0);  // document end
      }
      DTR_CHECK(static_cast<int64_t>(stream.size()) > d.seq_len, name, ": ", stream.size(),
                " bytes are fewer than seq_len + 1 = ", d.seq_len + 1);
      data::PackedDataset ds(std::move(stream), d.seq_len, /*eos_id=*/0);
      for (int64_t i = 0; i < ds.size(); ++i) out.push_back(ds.get(i));
    } else {
      DTR_CHECK(!tok_path.empty(), name, ".tokenizer is required with a random model (a GGUF, tokenizer.json or "
                                         "\"bytes\")");
      DTR_CHECK(fs::exists(tok_path), name, ".tokenizer: no such file '", tok_path, "'");
      const auto tok_ptr = tokenizer::load_tokenizer(tok_path);  // byte-level BPE or SentencePiece-style
      const tokenizer::Tokenizer& tok = *tok_ptr;
      pad = tok.pad_id() >= 0 ? tok.pad_id() : std::max(0, tok.eos_id());
      if (d.type == "squad" || d.type == "column_mapped") {
        out = load_instruction_dataset(d, tok, tokenizer_has_chat_template(tok_path));
      } else if (d.type == "chat_jsonl") {
        const auto tmpl = tokenizer::ChatTemplate::from_name(d.chat_template);
        for (const auto& f : d.paths) {
          auto s = data::load_chat_dataset(f, tok, tmpl, d.seq_len);
          out.insert(out.end(), s.begin(), s.end());
        }
      } else {
        auto ds = data::load_text_dataset(d.paths, tok, d.seq_len, d.doc_separator);
        for (int64_t i = 0; i < ds.size(); ++i) out.push_back(ds.get(i));
      }
    }
  }
  if (d.limit_samples > 0 && static_cast<int64_t>(out.size()) > d.limit_samples) out.resize(d.limit_samples);
  DTR_CHECK(!out.empty(), name, ": no samples in ", d.paths.front());
  if (d.packed_sequence_size > 0) out = data::pack_sequences(out, d.packed_sequence_size, pad);
  if (pad_id) *pad_id = pad;
  return out;
}

std::shared_ptr<LlamaForCausalLM> build_model(const Recipe& r, const Plan& p) {
  const DType dt = r.model.dtype == "bf16" ? DType::bf16 : DType::f32;
  manual_seed(r.seed);
  // Meta initialisation (tensor/meta.h): shapes only here; parallelize_model then gives each rank
  // its local shards, drawn from the same Philox stream or read from the file's byte ranges.
  std::shared_ptr<LlamaForCausalLM> model;
  if (r.model.random()) {
    MetaInitGuard g;
    model = std::make_shared<LlamaForCausalLM>(p.config, dt);
  } else {
    model = load_model_meta(r.model.path, dt);
  }
  if (r.peft.enabled) {
    MetaInitGuard g;
    manual_seed(r.seed + 1);
    apply_lora(*model, lora_config(r));
  }
  return model;
}

}  // namespace dtr::train
