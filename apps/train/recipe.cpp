#include "apps/train/recipe.h"

#include "models/transformer/memory_plan.h"

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "apps/train/automodel_compat.h"
#include "tensor/error.h"

namespace dtr::train {
namespace {

/// Reads the keys of one section, each with a typed getter; unknown keys are errors.
class Section {
 public:
  Section(const Recipe& r, const YAML::Node& node, std::string name) : r_(r), node_(node), name_(std::move(name)) {
    if (node_ && !node_.IsNull())
      DTR_CHECK(node_.IsMap(), name_, ": expected a map of settings, got '", YAML::Dump(node_), "' (",
                r_.source_of(name_), ")");
  }
  bool present() const { return node_ && !node_.IsNull(); }

  void i64(const char* key, int64_t& out) {
    if (auto n = get(key)) {
      try {
        out = n->as<int64_t>();
      } catch (...) {
        fail(key, "an integer", *n);
      }
    }
  }
  void f64(const char* key, double& out) {
    if (auto n = get(key)) {
      try {
        out = n->as<double>();
      } catch (...) {
        fail(key, "a number", *n);
      }
      if (!std::isfinite(out)) fail(key, "a finite number", *n);
    }
  }
  void boolean(const char* key, bool& out) {
    if (auto n = get(key)) {
      try {
        out = n->as<bool>();
      } catch (...) {
        fail(key, "true or false", *n);
      }
    }
  }
  void str(const char* key, std::string& out) {
    if (auto n = get(key)) {
      if (!n->IsScalar()) fail(key, "a string", *n);
      out = n->as<std::string>();
    }
  }
  void str_list(const char* key, std::vector<std::string>& out) {
    if (auto n = get(key)) {
      out.clear();
      if (n->IsScalar()) {
        out.push_back(n->as<std::string>());
      } else if (n->IsSequence()) {
        for (const auto& e : *n) {
          if (!e.IsScalar()) fail(key, "a list of strings", *n);
          out.push_back(e.as<std::string>());
        }
      } else {
        fail(key, "a string or a list of strings", *n);
      }
    }
  }
  void node(const char* key, YAML::Node& out) {
    if (auto n = get(key)) out = *n;
  }
  /// Marks `key` as known without reading it.
  std::optional<YAML::Node> get(const char* key) {
    known_.push_back(key);
    if (!present()) return std::nullopt;
    YAML::Node n = node_[key];
    if (!n.IsDefined() || n.IsNull()) return std::nullopt;
    return n;
  }
  /// Errors on keys that no getter asked for.
  void check_unknown() const {
    if (!present()) return;
    for (const auto& kv : node_) {
      const std::string k = kv.first.as<std::string>();
      if (std::find(known_.begin(), known_.end(), k) == known_.end()) {
        std::string list;
        for (const auto& s : known_) list += (list.empty() ? "" : ", ") + s;
        DTR_ERROR("unknown key ", name_, ".", k, " (", r_.source_of(name_ + "." + k), "); known keys of ", name_,
                  ": ", list);
      }
    }
  }
  [[noreturn]] void fail(const std::string& key, const char* what, const YAML::Node& n) const {
    std::string v = YAML::Dump(n);
    std::replace(v.begin(), v.end(), '\n', ' ');
    DTR_ERROR(name_, ".", key, ": expected ", what, ", got '", v, "' (", r_.source_of(name_ + "." + key), ")");
  }
  void require(bool ok, const std::string& key, const std::string& msg) const {
    if (!ok)
      DTR_ERROR(name_, ".", key, msg.rfind("=", 0) == 0 ? "" : " ", msg, " (", r_.source_of(name_ + "." + key), ")");
  }

 private:
  const Recipe& r_;
  YAML::Node node_;
  std::string name_;
  std::vector<std::string> known_;
};

void parse_dataset(Recipe& r, const YAML::Node& n, const std::string& name, DatasetRecipe& d) {
  Section s(r, n, name);
  d.enabled = s.present();
  s.str("type", d.type);
  s.str_list("path", d.paths);
  std::vector<std::string> more;
  s.str_list("paths", more);
  d.paths.insert(d.paths.end(), more.begin(), more.end());
  s.i64("seq_len", d.seq_len);
  s.i64("packed_sequence_size", d.packed_sequence_size);
  s.i64("pad_seq_len_divisible", d.pad_seq_len_divisible);
  s.str("doc_separator", d.doc_separator);
  s.i64("limit_samples", d.limit_samples);
  s.boolean("shuffle", d.shuffle);
  s.str("tokenizer", d.tokenizer);
  s.str("chat_template", d.chat_template);
  if (auto m = s.get("column_mapping")) {
    if (!m->IsMap()) s.fail("column_mapping", "a map of context / question / answer to JSON fields", *m);
    for (const auto& kv : *m) d.column_mapping[kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
  s.check_unknown();
  if (!d.enabled) return;
  const bool instruction = d.type == "squad" || d.type == "column_mapped";
  s.require(d.type == "chat_jsonl" || d.type == "text" || d.type == "token_shards" || instruction, "type",
            "must be chat_jsonl, text, token_shards, squad or column_mapped, got '" + d.type + "'");
  s.require(!d.paths.empty(), "path", "is required");
  s.require(d.seq_len >= 2 || (instruction && d.seq_len == 0), "seq_len",
            "must be >= 2" + std::string(instruction ? " or 0 (the longest sample)" : "") + ", got " +
                std::to_string(d.seq_len));
  s.require(d.type != "column_mapped" || d.column_mapping.count("answer"), "column_mapping",
            "must map 'answer' (and 'context' and / or 'question') to JSON fields");
  for (const auto& [role, field] : d.column_mapping)
    s.require(role == "context" || role == "question" || role == "answer", "column_mapping",
              "has role '" + role + "'; expected context, question, answer");
  s.require(d.packed_sequence_size >= 0, "packed_sequence_size",
            "must be >= 0 (0 = no packing), got " + std::to_string(d.packed_sequence_size));
  s.require(d.packed_sequence_size == 0 || d.type == "chat_jsonl" || instruction, "packed_sequence_size",
            "packs chat_jsonl / squad / column_mapped samples; " + d.type +
                " windows are already full rows of seq_len tokens");
  s.require(d.packed_sequence_size == 0 || d.packed_sequence_size >= d.seq_len, "packed_sequence_size",
            "=" + std::to_string(d.packed_sequence_size) + " is below seq_len=" + std::to_string(d.seq_len) +
                ": a pack holds whole samples of up to seq_len tokens");
  s.require(d.pad_seq_len_divisible >= 1, "pad_seq_len_divisible",
            "must be >= 1, got " + std::to_string(d.pad_seq_len_divisible));
  s.require(d.chat_template == "chatml" || d.chat_template == "smollm2" || d.chat_template == "gemma" ||
                d.chat_template == "llama3" || d.chat_template == "mistral",
            "chat_template", "must be one of chatml, smollm2, gemma, llama3, mistral, got '" + d.chat_template + "'");
  s.require(d.limit_samples >= 0, "limit_samples", "must be >= 0, got " + std::to_string(d.limit_samples));
}

std::string num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace

std::string Recipe::source_of(const std::string& key) const {
  // The value at `key` is the file's, replaced by the last --set of `key` or of a map above it,
  // then changed by the --set of keys below it that came after that one.
  std::string source = file;
  size_t from = 0;
  for (size_t i = 0; i < overridden.size(); ++i)
    if (overridden[i] == key || key.rfind(overridden[i] + ".", 0) == 0) {
      source = "--set " + overridden[i];
      from = i + 1;
    }
  for (size_t i = from; i < overridden.size(); ++i)
    if (overridden[i].rfind(key + ".", 0) == 0) source += ", --set " + overridden[i];
  return source;
}

void apply_override(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  DTR_CHECK(eq != std::string::npos && eq > 0, "--set ", assignment, ": expected key.path=value");
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) {
    DTR_CHECK(!p.empty(), "--set ", assignment, ": empty component in key '", key, "'");
    parts.push_back(p);
  }
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    DTR_ERROR("--set ", assignment, ": value is not valid YAML: ", e.msg);
  }
  // yaml-cpp node handles are references: walk with fresh handles per level.
  std::function<void(YAML::Node, size_t)> set = [&](YAML::Node cur, size_t i) {
    if (i + 1 == parts.size()) {
      cur[parts[i]] = parsed;
      return;
    }
    YAML::Node child = cur[parts[i]];
    if (!child || child.IsNull() || !child.IsMap()) {
      DTR_CHECK(!child || child.IsNull() || child.IsMap(), "--set ", assignment, ": ",
                key.substr(0, key.find(parts[i]) + parts[i].size()), " is not a map");
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      child = cur[parts[i]];
    }
    set(child, i + 1);
  };
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  set(root, 0);
}

Recipe parse_recipe(const YAML::Node& automodel_root, const std::string& file,
                    const std::vector<std::string>& overridden) {
  Recipe r;
  r.file = file;
  const YAML::Node root = translate_automodel(automodel_root, file, r.ignored_keys);
  r.root = root;
  r.overridden = overridden;
  DTR_CHECK(root && root.IsMap(), file, ": expected a YAML map of sections (model, dataset, ...)");
  static const std::vector<std::string> sections = {
      "model",          "peft",      "distributed", "dataset",  "validation_dataset", "step_scheduler",
      "optimizer",      "lr_scheduler", "checkpoint", "logging", "rng"};
  for (const auto& kv : root) {
    const std::string k = kv.first.as<std::string>();
    if (std::find(sections.begin(), sections.end(), k) == sections.end()) {
      std::string list;
      for (const auto& s : sections) list += (list.empty() ? "" : ", ") + s;
      DTR_ERROR("unknown section '", k, "' (", r.source_of(k), "); known sections: ", list);
    }
  }

  {  // model
    Section s(r, root["model"], "model");
    s.str("path", r.model.path);
    s.str("pretrained_model_name_or_path", r.model.path);
    if (auto n = s.get("config")) {
      if (n->IsScalar()) r.model.config_name = n->as<std::string>();
      else if (n->IsMap()) r.model.config = *n;
      else s.fail("config", "'debug' or a map of LlamaConfig keys", *n);
    }
    s.str("dtype", r.model.dtype);
    s.str("device", r.model.device);
    s.check_unknown();
    // (a default YAML::Node converts to true: ask for a map)
    s.require(!r.model.path.empty() || !r.model.config_name.empty() || r.model.config.IsMap(), "path",
              "is required (or model.config: debug / a map of LlamaConfig keys for a random model)");
    bool builtin = r.model.config_name.empty() || r.model.config_name == "debug";
    for (const auto& n : builtin_model_names()) builtin = builtin || r.model.config_name == n;
    s.require(builtin, "config", "must be 'debug', a built-in shape (" + [] {
      std::string k;
      for (const auto& n : builtin_model_names()) k += (k.empty() ? "" : ", ") + n;
      return k;
    }() + ") or a map, got '" + r.model.config_name + "'");
    s.require(r.model.dtype == "f32" || r.model.dtype == "float32" || r.model.dtype == "bf16" ||
                  r.model.dtype == "bfloat16",
              "dtype", "must be f32 or bf16, got '" + r.model.dtype + "'");
    if (r.model.dtype == "float32") r.model.dtype = "f32";
    if (r.model.dtype == "bfloat16") r.model.dtype = "bf16";
    s.require(r.model.device == "cpu" || r.model.device == "cuda", "device",
              "must be cpu or cuda, got '" + r.model.device + "'");
  }
  {  // peft
    Section s(r, root["peft"], "peft");
    r.peft.enabled = s.present();
    s.str_list("target_modules", r.peft.target_modules);
    s.str_list("exclude_modules", r.peft.exclude_modules);
    s.i64("dim", r.peft.dim);
    s.f64("alpha", r.peft.alpha);
    s.f64("dropout", r.peft.dropout);
    s.str("dropout_position", r.peft.dropout_position);
    s.boolean("use_rslora", r.peft.use_rslora);
    s.check_unknown();
    s.require(r.peft.dim > 0, "dim", "must be > 0, got " + std::to_string(r.peft.dim));
    s.require(r.peft.alpha > 0, "alpha", "must be > 0, got " + num(r.peft.alpha));
    s.require(r.peft.dropout >= 0 && r.peft.dropout < 1, "dropout", "must be in [0, 1), got " + num(r.peft.dropout));
    s.require(r.peft.dropout_position == "pre" || r.peft.dropout_position == "post", "dropout_position",
              "must be pre or post, got '" + r.peft.dropout_position + "'");
    s.require(!r.peft.target_modules.empty(), "target_modules", "must not be empty");
    // Globs ('*' = any run) are matched in O(pattern x name); bound the pattern anyway.
    for (const auto* list : {&r.peft.target_modules, &r.peft.exclude_modules})
      for (const auto& p : *list)
        s.require(!p.empty() && p.size() <= 1024, list == &r.peft.target_modules ? "target_modules" : "exclude_modules",
                  "entries must be 1 to 1024 characters, got one of " + std::to_string(p.size()));
  }
  r.distributed = root["distributed"];
  if (r.distributed && !r.distributed.IsNull())
    DTR_CHECK(r.distributed.IsMap(), "distributed: expected a map of settings (", r.source_of("distributed"), ")");
  parse_dataset(r, root["dataset"], "dataset", r.dataset);
  DTR_CHECK(r.dataset.enabled, "dataset: section is required (", file, ")");
  parse_dataset(r, root["validation_dataset"], "validation_dataset", r.validation_dataset);
  {
    Section s(r, root["step_scheduler"], "step_scheduler");
    auto& st = r.step_scheduler;
    s.i64("global_batch_size", st.global_batch_size);
    s.i64("local_batch_size", st.local_batch_size);
    s.i64("max_steps", st.max_steps);
    s.i64("num_epochs", st.num_epochs);
    s.i64("ckpt_every_steps", st.ckpt_every_steps);
    s.boolean("save_checkpoint_every_epoch", st.save_checkpoint_every_epoch);
    s.i64("val_every_steps", st.val_every_steps);
    s.i64("val_batches", st.val_batches);
    s.str("on_nonfinite", st.on_nonfinite);
    s.check_unknown();
    s.require(st.on_nonfinite == "error" || st.on_nonfinite == "skip", "on_nonfinite",
              "must be error or skip, got '" + st.on_nonfinite + "'");
    s.require(st.global_batch_size >= 1, "global_batch_size", "must be >= 1, got " + std::to_string(st.global_batch_size));
    s.require(st.local_batch_size >= 1, "local_batch_size", "must be >= 1, got " + std::to_string(st.local_batch_size));
    s.require(st.global_batch_size % st.local_batch_size == 0, "global_batch_size",
              "=" + std::to_string(st.global_batch_size) + " is not a multiple of step_scheduler.local_batch_size=" +
                  std::to_string(st.local_batch_size));
    s.require(st.max_steps >= 0, "max_steps", "must be >= 0, got " + std::to_string(st.max_steps));
    s.require(st.num_epochs >= 1, "num_epochs", "must be >= 1, got " + std::to_string(st.num_epochs));
    s.require(st.ckpt_every_steps >= 0, "ckpt_every_steps", "must be >= 0, got " + std::to_string(st.ckpt_every_steps));
    s.require(st.val_every_steps >= 0, "val_every_steps", "must be >= 0, got " + std::to_string(st.val_every_steps));
    s.require(st.val_batches >= 0, "val_batches", "must be >= 0, got " + std::to_string(st.val_batches));
  }
  {
    Section s(r, root["optimizer"], "optimizer");
    auto& o = r.optimizer;
    s.str("name", o.name);
    s.f64("lr", o.lr);
    if (auto n = s.get("betas")) {
      if (!n->IsSequence() || n->size() != 2) s.fail("betas", "a list of two numbers", *n);
      try {
        o.beta1 = (*n)[0].as<double>();
        o.beta2 = (*n)[1].as<double>();
      } catch (...) {
        s.fail("betas", "a list of two numbers", *n);
      }
    }
    s.f64("eps", o.eps);
    s.f64("weight_decay", o.weight_decay);
    s.f64("max_grad_norm", o.max_grad_norm);
    s.f64("clip_grad", o.max_grad_norm);
    s.check_unknown();
    std::string lname = o.name;
    std::transform(lname.begin(), lname.end(), lname.begin(), ::tolower);
    s.require(lname == "adamw" || lname == "adam", "name", "must be adamw or adam, got '" + o.name + "'");
    o.name = lname;
    // torch.optim.Adam adds weight_decay * param to the gradient (L2), AdamW decays the weight;
    // with weight_decay 0 the two are the same update, which is what dtr runs.
    s.require(lname != "adam" || o.weight_decay == 0, "weight_decay",
              "=" + num(o.weight_decay) + " with Adam (L2 in the gradient) is not built in dtr; use "
              "torch.optim.AdamW / name adamw, or weight_decay 0");
    s.require(o.lr >= 0, "lr", "must be >= 0, got " + num(o.lr));
    s.require(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "betas",
              "must lie in [0, 1), got [" + num(o.beta1) + ", " + num(o.beta2) + "]");
    s.require(o.eps >= 0, "eps", "must be >= 0, got " + num(o.eps));
    s.require(o.weight_decay >= 0, "weight_decay", "must be >= 0, got " + num(o.weight_decay));
    s.require(o.max_grad_norm >= 0, "max_grad_norm", "must be >= 0, got " + num(o.max_grad_norm));
  }
  {
    Section s(r, root["lr_scheduler"], "lr_scheduler");
    auto& l = r.lr_scheduler;
    l.enabled = s.present();
    s.i64("lr_warmup_steps", l.lr_warmup_steps);
    s.str("lr_decay_style", l.lr_decay_style);
    s.f64("init_lr", l.init_lr);
    s.f64("min_lr", l.min_lr);
    s.i64("lr_decay_steps", l.lr_decay_steps);
    s.check_unknown();
    s.require(l.lr_decay_style == "cosine" || l.lr_decay_style == "linear" || l.lr_decay_style == "constant",
              "lr_decay_style", "must be cosine, linear or constant, got '" + l.lr_decay_style + "'");
    s.require(l.lr_warmup_steps >= -1, "lr_warmup_steps", "must be >= 0, got " + std::to_string(l.lr_warmup_steps));
    if (l.min_lr < 0) l.min_lr = 0.01 * r.optimizer.lr;
    if (l.init_lr < 0) l.init_lr = 0.1 * r.optimizer.lr;
    s.require(l.min_lr <= r.optimizer.lr, "min_lr",
              "must be in [0, optimizer.lr=" + num(r.optimizer.lr) + "], got " + num(l.min_lr));
    s.require(l.init_lr <= r.optimizer.lr, "init_lr",
              "must be in [0, optimizer.lr=" + num(r.optimizer.lr) + "], got " + num(l.init_lr));
    s.require(l.lr_decay_steps >= 0, "lr_decay_steps", "must be >= 0, got " + std::to_string(l.lr_decay_steps));
  }
  {
    Section s(r, root["checkpoint"], "checkpoint");
    auto& c = r.checkpoint;
    s.boolean("enabled", c.enabled);
    s.str("checkpoint_dir", c.checkpoint_dir);
    s.i64("keep_last", c.keep_last);
    c.save_consolidated = !r.peft.enabled;  // Automodel's "final"; the adapter is LoRA's export
    s.boolean("save_consolidated", c.save_consolidated);
    s.str("adapter_dir", c.adapter_dir);
    s.str("base_model_name_or_path", c.base_model_name_or_path);
    s.check_unknown();
    s.require(!c.checkpoint_dir.empty(), "checkpoint_dir", "must not be empty");
    s.require(c.keep_last >= 0, "keep_last", "must be >= 0, got " + std::to_string(c.keep_last));
    if (c.adapter_dir.empty()) c.adapter_dir = c.checkpoint_dir + "/adapter";
  }
  {
    Section s(r, root["logging"], "logging");
    auto& l = r.logging;
    s.i64("every_steps", l.every_steps);
    s.str("metrics_file", l.metrics_file);
    s.str("plot_file", l.plot_file);
    if (auto n = s.get("peak_tflops")) {  // a number (per rank), or "measure": a start-up SGEMM
      if (n->IsScalar() && n->Scalar() == "measure") l.peak_tflops = -1;
      else s.f64("peak_tflops", l.peak_tflops);
    }
    s.check_unknown();
    s.require(l.every_steps >= 1, "every_steps", "must be >= 1, got " + std::to_string(l.every_steps));
    s.require(l.peak_tflops >= 0 || l.peak_tflops == -1, "peak_tflops",
              "must be >= 0 or 'measure', got " + num(l.peak_tflops));
    if (l.metrics_file.empty()) l.metrics_file = r.checkpoint.checkpoint_dir + "/metrics.jsonl";
    if (l.plot_file.empty()) l.plot_file = r.checkpoint.checkpoint_dir + "/loss.png";
  }
  {
    Section s(r, root["rng"], "rng");
    int64_t seed = static_cast<int64_t>(r.seed);
    s.i64("seed", seed);
    s.check_unknown();
    s.require(seed >= 0, "seed", "must be >= 0, got " + std::to_string(seed));
    r.seed = static_cast<uint64_t>(seed);
  }
  return r;
}

int64_t StepSchedulerRecipe::total_steps(int64_t batches_per_epoch) const {
  int64_t epoch_steps = 0;
  if (__builtin_mul_overflow(num_epochs, batches_per_epoch, &epoch_steps))
    epoch_steps = std::numeric_limits<int64_t>::max();
  return max_steps > 0 ? std::min(max_steps, epoch_steps) : epoch_steps;
}

Recipe load_recipe(const std::string& file, const std::vector<std::string>& overrides) {
  {
    std::error_code ec;
    DTR_CHECK(!std::filesystem::is_directory(file, ec), "--config: '", file,
              "' is a directory, expected a recipe YAML file");
    std::ifstream f(file);
    DTR_CHECK(f.good(), "cannot read recipe file '", file, "'");
  }
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    DTR_ERROR(file, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax: ", e.msg);
  }
  // --set walks maps: say what the file holds instead of yaml-cpp's "operator[] call on a scalar".
  const char* kind = !root || root.IsNull() ? "nothing (an empty file)" : root.IsScalar() ? "a scalar" : "a list";
  DTR_CHECK(root.IsMap() || ((!root || root.IsNull()) && !overrides.empty()), file,
            ": expected a YAML map of sections (model, dataset, ...), the file holds ", kind);
  std::vector<std::string> keys;
  for (const auto& o : overrides) {
    apply_override(root, o);
    keys.push_back(o.substr(0, o.find('=')));
  }
  return parse_recipe(root, file, keys);
}

std::string dump_recipe(const Recipe& r) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (!r.model.path.empty()) e << YAML::Key << "path" << YAML::Value << r.model.path;
  if (!r.model.config_name.empty()) e << YAML::Key << "config" << YAML::Value << r.model.config_name;
  if (r.model.config.IsMap()) e << YAML::Key << "config" << YAML::Value << r.model.config;
  e << YAML::Key << "dtype" << YAML::Value << r.model.dtype;
  e << YAML::Key << "device" << YAML::Value << r.model.device << YAML::EndMap;
  if (r.peft.enabled) {
    e << YAML::Key << "peft" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "target_modules" << YAML::Value << YAML::Flow << r.peft.target_modules;
    e << YAML::Key << "exclude_modules" << YAML::Value << YAML::Flow << r.peft.exclude_modules;
    e << YAML::Key << "dim" << YAML::Value << r.peft.dim << YAML::Key << "alpha" << YAML::Value << r.peft.alpha;
    e << YAML::Key << "dropout" << YAML::Value << r.peft.dropout;
    e << YAML::Key << "dropout_position" << YAML::Value << r.peft.dropout_position;
    e << YAML::Key << "use_rslora" << YAML::Value << r.peft.use_rslora << YAML::EndMap;
  }
  if (r.distributed && !r.distributed.IsNull()) e << YAML::Key << "distributed" << YAML::Value << r.distributed;
  auto ds = [&](const char* name, const DatasetRecipe& d) {
    if (!d.enabled) return;
    e << YAML::Key << name << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "type" << YAML::Value << d.type;
    e << YAML::Key << "paths" << YAML::Value << YAML::Flow << d.paths;
    e << YAML::Key << "seq_len" << YAML::Value << d.seq_len;
    e << YAML::Key << "packed_sequence_size" << YAML::Value << d.packed_sequence_size;
    e << YAML::Key << "pad_seq_len_divisible" << YAML::Value << d.pad_seq_len_divisible;
    e << YAML::Key << "limit_samples" << YAML::Value << d.limit_samples;
    e << YAML::Key << "shuffle" << YAML::Value << d.shuffle;
    if (!d.tokenizer.empty()) e << YAML::Key << "tokenizer" << YAML::Value << d.tokenizer;
    if (!d.column_mapping.empty()) e << YAML::Key << "column_mapping" << YAML::Value << d.column_mapping;
    e << YAML::Key << "chat_template" << YAML::Value << d.chat_template << YAML::EndMap;
  };
  ds("dataset", r.dataset);
  ds("validation_dataset", r.validation_dataset);
  const auto& st = r.step_scheduler;
  e << YAML::Key << "step_scheduler" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "global_batch_size" << YAML::Value << st.global_batch_size;
  e << YAML::Key << "local_batch_size" << YAML::Value << st.local_batch_size;
  e << YAML::Key << "max_steps" << YAML::Value << st.max_steps;
  e << YAML::Key << "num_epochs" << YAML::Value << st.num_epochs;
  e << YAML::Key << "ckpt_every_steps" << YAML::Value << st.ckpt_every_steps;
  e << YAML::Key << "save_checkpoint_every_epoch" << YAML::Value << st.save_checkpoint_every_epoch;
  e << YAML::Key << "val_every_steps" << YAML::Value << st.val_every_steps;
  e << YAML::Key << "val_batches" << YAML::Value << st.val_batches;
  e << YAML::Key << "on_nonfinite" << YAML::Value << st.on_nonfinite << YAML::EndMap;
  const auto& o = r.optimizer;
  e << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << o.name << YAML::Key << "lr" << YAML::Value << o.lr;
  e << YAML::Key << "betas" << YAML::Value << YAML::Flow << std::vector<double>{o.beta1, o.beta2};
  e << YAML::Key << "eps" << YAML::Value << o.eps << YAML::Key << "weight_decay" << YAML::Value << o.weight_decay;
  e << YAML::Key << "max_grad_norm" << YAML::Value << o.max_grad_norm << YAML::EndMap;
  const auto& l = r.lr_scheduler;
  if (l.enabled) {  // no section: constant optimizer.lr
    e << YAML::Key << "lr_scheduler" << YAML::Value << YAML::BeginMap;
    e << YAML::Key << "lr_warmup_steps" << YAML::Value << l.lr_warmup_steps;  // -1: min(1000, total / 10)
    e << YAML::Key << "lr_decay_style" << YAML::Value << l.lr_decay_style;
    e << YAML::Key << "init_lr" << YAML::Value << l.init_lr;
    e << YAML::Key << "min_lr" << YAML::Value << l.min_lr;
    e << YAML::Key << "lr_decay_steps" << YAML::Value << l.lr_decay_steps << YAML::EndMap;
  }
  const auto& c = r.checkpoint;
  e << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "enabled" << YAML::Value << c.enabled;
  e << YAML::Key << "checkpoint_dir" << YAML::Value << c.checkpoint_dir;
  e << YAML::Key << "keep_last" << YAML::Value << c.keep_last;
  e << YAML::Key << "save_consolidated" << YAML::Value << c.save_consolidated;
  e << YAML::Key << "adapter_dir" << YAML::Value << c.adapter_dir;
  if (!c.base_model_name_or_path.empty())
    e << YAML::Key << "base_model_name_or_path" << YAML::Value << c.base_model_name_or_path;
  e << YAML::EndMap;
  const auto& g = r.logging;
  e << YAML::Key << "logging" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "every_steps" << YAML::Value << g.every_steps;
  e << YAML::Key << "metrics_file" << YAML::Value << g.metrics_file;
  e << YAML::Key << "plot_file" << YAML::Value << g.plot_file;
  if (g.peak_tflops < 0) e << YAML::Key << "peak_tflops" << YAML::Value << "measure" << YAML::EndMap;
  else e << YAML::Key << "peak_tflops" << YAML::Value << g.peak_tflops << YAML::EndMap;
  e << YAML::Key << "rng" << YAML::Value << YAML::BeginMap << YAML::Key << "seed" << YAML::Value << r.seed
    << YAML::EndMap;
  e << YAML::EndMap;
  return e.c_str();
}

}  // namespace dtr::train
