#include "apps/train/automodel_compat.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>

#include "tensor/error.h"

namespace dtr::train {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string one_line(const YAML::Node& n) {
  std::string v = YAML::Dump(n);
  std::replace(v.begin(), v.end(), '\n', ' ');
  return v;
}

/// "none" / "None" / "null" / ~ : Automodel's "derive this size".
bool is_none(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return true;
  if (!n.IsScalar()) return false;
  const std::string s = n.Scalar();
  return s == "none" || s == "None" || s == "null" || s == "Null" || s == "NULL";
}

bool is_false(const YAML::Node& n) {
  if (is_none(n)) return true;
  try {
    return !n.as<bool>();
  } catch (...) {
    return false;
  }
}

/// root[section][key], or an undefined node when the section is not a map (the parser reports it).
YAML::Node sub(const YAML::Node& root, const char* section, const char* key) {
  const YAML::Node& sec = root[section];
  if (!sec.IsDefined() || !sec.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  return sec[key];
}

double as_number(const YAML::Node& n, double fallback) {
  try {
    return n.as<double>();
  } catch (...) {
    return fallback;
  }
}

/// One section of the tree being rewritten, with the operations the rules need.
class Sec {
 public:
  Sec(YAML::Node root, std::string name, const std::string& file, std::vector<std::string>& ignored)
      : root_(root), name_(std::move(name)), file_(file), ignored_(ignored) {}
  bool present() const { return cget(root_, name_).IsDefined() && cget(root_, name_).IsMap(); }
  YAML::Node get(const std::string& k) const { return present() ? cget(node(), k) : YAML::Node(); }
  bool has(const std::string& k) const { return get(k).IsDefined(); }
  std::string target() const { return has("_target_") && get("_target_").IsScalar() ? get("_target_").Scalar() : ""; }
  void drop(const std::string& k) {
    if (has(k)) node().remove(k);
  }
  /// Keys accepted without effect on the results: recorded for the warning line, removed.
  void ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys)
      if (has(k)) {
        ignored_.push_back(name_ + "." + k);
        drop(k);
      }
  }
  /// A key dtr reads under another name.
  void rename(const std::string& from, const std::string& to) {
    if (!has(from)) return;
    YAML::Node v = get(from);
    drop(from);
    if (!has(to)) node()[to] = v;
  }
  /// A key that changes the results unless `ok(value)`: removed when ok, else an error.
  void reject_unless(const std::string& k, const std::function<bool(const YAML::Node&)>& ok, const std::string& why) {
    if (!has(k)) return;
    if (!ok(get(k))) fail(k, why);
    drop(k);
  }
  [[noreturn]] void fail(const std::string& k, const std::string& why) const {
    DTR_ERROR(name_, ".", k, "=", one_line(get(k)), " (", file_, "): ", why);
  }
  void set(const std::string& k, const YAML::Node& v) { node()[k] = v; }
  YAML::Node node() const { return root_[name_]; }
  const std::string& name() const { return name_; }

 private:
  static YAML::Node cget(const YAML::Node& n, const std::string& k) {
    const YAML::Node& c = n;
    return c[k];
  }
  YAML::Node root_;
  std::string name_;
  const std::string& file_;
  std::vector<std::string>& ignored_;
};

constexpr const char* kNotBuilt = "not built in dtr";

/// A section whose every key is ignored (logging services, CI metadata, launcher settings).
void ignore_section(YAML::Node& root, const std::string& name, std::vector<std::string>& ignored) {
  const YAML::Node& c = root;
  if (!c[name].IsDefined()) return;
  ignored.push_back(name);
  root.remove(name);
}

/// The local file behind an HF-style dataset id: a .json / .jsonl file as given, or in a directory
/// `<split>.jsonl` / `<split>.json` (load_dataset's data-files convention). A split slice
/// "train[:N]" becomes limit_samples N.
void resolve_local_dataset(Sec& s, const std::string& id_key, const std::string& file) {
  std::string split = s.has("split") ? s.get("split").as<std::string>() : "train";
  s.drop("split");
  const auto br = split.find('[');
  if (br != std::string::npos) {
    const std::string slice = split.substr(br);
    split = split.substr(0, br);
    int64_t n = 0;
    DTR_CHECK(std::sscanf(slice.c_str(), "[:%lld]", reinterpret_cast<long long*>(&n)) == 1 && n > 0,
              s.name(), ".split='", split, slice, "' (", file, "): only a leading slice [:N] is supported");
    if (!s.has("limit_samples")) s.set("limit_samples", YAML::Node(n));
  }
  DTR_CHECK(s.has(id_key), s.name(), ".", id_key, " is required (", file, ")");
  const std::string id = s.get(id_key).as<std::string>();
  s.drop(id_key);
  std::string path = id;
  if (fs::is_directory(id)) {
    path.clear();
    for (const char* ext : {".jsonl", ".json"})
      if (fs::exists(fs::path(id) / (split + ext))) {
        path = (fs::path(id) / (split + ext)).string();
        break;
      }
    DTR_CHECK(!path.empty(), s.name(), ".", id_key, "='", id, "' (", file, "): directory has no ", split,
              ".jsonl or ", split, ".json for split '", split, "'");
  }
  DTR_CHECK(fs::exists(path), s.name(), ".", id_key, "='", id, "' (", file,
            "): not a local file or directory; dtr reads local JSON / JSONL files only (download the dataset "
            "and give its path)");
  s.set("path", YAML::Node(path));
}

/// dataset / validation_dataset with a `_target_`: Automodel's dataset builders.
void translate_dataset(Sec& s, const std::string& file) {
  const std::string t = s.target();
  if (t.empty()) return;
  s.drop("_target_");
  if (ends_with(t, "make_squad_dataset")) {
    s.set("type", YAML::Node("squad"));
    resolve_local_dataset(s, "dataset_name", file);
    s.rename("limit_dataset_samples", "limit_samples");
  } else if (ends_with(t, "ColumnMappedTextInstructionDataset")) {
    s.set("type", YAML::Node("column_mapped"));
    resolve_local_dataset(s, "path_or_dataset_id", file);
    s.rename("limit_dataset_samples", "limit_samples");
    s.reject_unless("answer_only_loss_mask", [](const YAML::Node& v) { return !is_false(v); },
                    "false (loss on the prompt too) is not built in dtr");
  } else {
    DTR_ERROR(s.name(), "._target_=", t, " (", file, "): ", kNotBuilt,
              " (dtr builds make_squad_dataset and ColumnMappedTextInstructionDataset on local JSON / JSONL files, "
              "or its own dataset.type chat_jsonl | text | token_shards)");
  }
  // No seq_length: Automodel pads each batch to its longest sample and never truncates; dtr pads
  // every sample to one length, which gives the same loss when that length is the longest sample
  // (seq_len 0).
  if (s.has("seq_length")) s.rename("seq_length", "seq_len");
  else s.set("seq_len", YAML::Node(0));
  s.ignore({"padding", "truncation", "fp8"});
  if (s.has("chat_template")) {
    const YAML::Node v = s.get("chat_template");
    if (!(v.IsScalar() && (v.Scalar() == "chatml" || v.Scalar() == "smollm2")))
      s.fail("chat_template", "a Jinja chat template is not built in dtr (use chatml or smollm2)");
  }
}

/// dataloader / validation_dataloader: StatefulDataLoader with the default collater.
void translate_dataloader(YAML::Node& root, const std::string& name, const std::string& dataset, const std::string& file,
                          std::vector<std::string>& ignored) {
  Sec s(root, name, file, ignored);
  if (!s.present()) {
    ignore_section(root, name, ignored);
    return;
  }
  const std::string t = s.target();
  if (!t.empty() && !ends_with(t, "StatefulDataLoader") && !ends_with(t, "DataLoader"))
    s.fail("_target_", std::string(kNotBuilt) + " (expected torchdata StatefulDataLoader or torch DataLoader)");
  s.drop("_target_");
  if (s.has("collate_fn")) {
    YAML::Node c = s.get("collate_fn");
    const std::string ct = c.IsScalar() ? c.Scalar() : (c.IsMap() && c["_target_"] ? c["_target_"].as<std::string>() : "");
    if (!ends_with(ct, "default_collater"))
      s.fail("collate_fn", std::string(kNotBuilt) + " (dtr pads with the default collater's rule: labels -100)");
    if (c.IsMap() && c["pad_seq_len_divisible"]) {  // default_collater's rounding of each batch's length
      Sec d(root, dataset, file, ignored);
      if (d.present() && !d.has("pad_seq_len_divisible")) d.set("pad_seq_len_divisible", c["pad_seq_len_divisible"]);
    }
    s.drop("collate_fn");
  }
  if (s.has("shuffle")) {
    Sec d(root, dataset, file, ignored);
    if (d.present() && !d.has("shuffle")) d.set("shuffle", s.get("shuffle"));
    s.drop("shuffle");
  }
  s.ignore({"num_workers", "pin_memory", "persistent_workers", "prefetch_factor"});
  s.reject_unless("drop_last", [](const YAML::Node&) { return true; }, "");
  if (s.present())
    for (const auto& kv : s.node())
      s.fail(kv.first.as<std::string>(), std::string(kNotBuilt) + " (dataloader keys: _target_, collate_fn, shuffle, "
                                                           "num_workers, pin_memory, persistent_workers, prefetch_factor)");
  root.remove(name);
}

}  // namespace

YAML::Node translate_automodel(const YAML::Node& in, const std::string& file, std::vector<std::string>& ignored) {
  if (!in || !in.IsMap()) return in;
  YAML::Node root = YAML::Clone(in);
  auto sec = [&](const std::string& name) { return Sec(root, name, file, ignored); };
  const YAML::Node& croot = root;

  if (croot["recipe"].IsDefined()) {
    const std::string r = croot["recipe"].IsScalar() ? croot["recipe"].Scalar() : "";
    DTR_CHECK(ends_with(r, "TrainFinetuneRecipeForNextTokenPrediction"), "recipe=", one_line(croot["recipe"]), " (",
              file, "): ", kNotBuilt, " (dtr-train runs TrainFinetuneRecipeForNextTokenPrediction)");
    root.remove("recipe");
  }
  for (const char* s : {"dist_env", "ci", "wandb", "mlflow", "comet", "nvtx", "moe_metrics", "profiling"})
    ignore_section(root, s, ignored);
  for (const char* s : {"fp8", "quantization", "qat", "neftune", "mtp", "prewarm", "embedding_row_repair",
                        "tool_call_eval", "teacher_model", "kd_ratio", "kd_loss_fn", "freeze_config", "sdpa_method"}) {
    if (croot[s].IsDefined() && !is_false(croot[s]) &&
        !(croot[s].IsMap() && croot[s]["enabled"].IsDefined() && is_false(croot[s]["enabled"])))
      DTR_ERROR(s, " (", file, "): ", kNotBuilt, " (it would change the results)");
    if (croot[s].IsDefined()) {
      ignored.push_back(s);
      root.remove(s);
    }
  }
  if (croot["seed"].IsDefined()) {  // train_ft.py reads cfg.seed
    if (!croot["rng"].IsDefined()) root["rng"]["seed"] = croot["seed"];
    else if (croot["rng"].IsMap() && !croot["rng"]["seed"].IsDefined()) root["rng"]["seed"] = croot["seed"];
    root.remove("seed");
  }
  {
    Sec s = sec("rng");
    if (s.present()) {
      if (!s.target().empty() && !ends_with(s.target(), "StatefulRNG")) s.fail("_target_", kNotBuilt);
      s.drop("_target_");
      s.ignore({"ranked"});  // dtr draws by global element offset: the same numbers on every mesh
    }
  }
  {
    Sec s = sec("model");
    if (s.present()) {
      const std::string t = s.target();
      if (!t.empty() && !ends_with(t, "from_pretrained") && !ends_with(t, "from_config"))
        s.fail("_target_", std::string(kNotBuilt) + " (expected NeMoAutoModelForCausalLM.from_pretrained)");
      s.drop("_target_");
      if (s.has("torch_dtype")) {
        std::string d = s.get("torch_dtype").as<std::string>();
        if (d.rfind("torch.", 0) == 0) d = d.substr(6);
        if (d != "auto") s.set("dtype", YAML::Node(d));
        s.drop("torch_dtype");
      }
      s.ignore({"attn_implementation", "use_liger_kernel", "trust_remote_code", "use_sdpa_patching", "backend",
                "force_hf", "output_hidden_states"});
    }
  }
  {
    Sec s = sec("peft");
    if (s.present()) {
      if (!s.target().empty() && !ends_with(s.target(), "PeftConfig")) s.fail("_target_", kNotBuilt);
      s.drop("_target_");
      s.ignore({"use_triton", "use_memory_efficient_lora"});
      s.reject_unless("match_all_linear", is_false, "true is not built in dtr (give target_modules)");
      s.reject_unless("use_dora", is_false, "DoRA is not built in dtr");
      s.reject_unless("lora_dtype", is_none, "a LoRA dtype other than the model's is not built in dtr");
      s.reject_unless("moe_rank_scaling", is_false, kNotBuilt);
    }
  }
  {
    Sec s = sec("distributed");
    if (s.present()) {
      const std::string t = s.target();
      if (!t.empty()) {
        if (ends_with(t, "FSDP2Config")) s.set("strategy", YAML::Node("fsdp2"));
        else if (ends_with(t, "DDPConfig")) s.set("strategy", YAML::Node("ddp"));
        else s.fail("_target_", std::string(kNotBuilt) + " (expected FSDP2Config or DDPConfig)");
        s.drop("_target_");
      }
      for (const char* k : {"dp_size", "dp_replicate_size", "tp_size", "cp_size", "pp_size", "ep_size"})
        if (s.has(k) && is_none(s.get(k))) s.drop(k);
      s.ignore({"backend", "timeout_minutes"});
    }
  }
  {
    Sec s = sec("loss_fn");
    if (s.present()) {
      const std::string t = s.target();
      if (!ends_with(t, "MaskedCrossEntropy") && !ends_with(t, "FusedLinearCrossEntropy"))
        s.fail("_target_", std::string(kNotBuilt) + " (dtr's loss is MaskedCrossEntropy: token mean over labels != -100)");
      s.drop("_target_");
      s.reject_unless("ignore_index", [](const YAML::Node& v) { return as_number(v, 0) == -100; },
                      "dtr ignores label -100 only");
      s.ignore({"fp32_upcast", "reduction"});
      for (const auto& kv : s.node()) s.fail(kv.first.as<std::string>(), kNotBuilt);
      root.remove("loss_fn");
    } else if (croot["loss_fn"].IsDefined()) {
      root.remove("loss_fn");
    }
  }
  for (const char* d : {"dataset", "validation_dataset"}) {
    Sec s = sec(d);
    if (s.present()) translate_dataset(s, file);
  }
  translate_dataloader(root, "dataloader", "dataset", file, ignored);
  translate_dataloader(root, "validation_dataloader", "validation_dataset", file, ignored);
  {
    Sec s = sec("packed_sequence");
    if (s.present()) {
      // Automodel packs the training dataset (its pack_dataset); dtr's dataset.packed_sequence_size.
      Sec ds = sec("dataset");
      if (s.has("packed_sequence_size") && ds.present() && !ds.has("packed_sequence_size"))
        ds.set("packed_sequence_size", s.get("packed_sequence_size"));
      s.drop("packed_sequence_size");
      s.reject_unless("split_across_pack", is_false, "splitting a sample across packs is not built in dtr (use false)");
      s.ignore({"packing_strategy", "max_packs"});
      for (const auto& kv : s.node()) s.fail(kv.first.as<std::string>(), kNotBuilt);
    }
    if (croot["packed_sequence"].IsDefined()) root.remove("packed_sequence");
  }
  {
    Sec s = sec("clip_grad_norm");
    if (s.present()) {
      // train_ft.py: a missing or null max_norm means 1.0 (dtr's default).
      if (s.has("max_norm") && !is_none(s.get("max_norm"))) {
        DTR_CHECK(!croot["optimizer"].IsDefined() || croot["optimizer"].IsMap(), "optimizer: expected a map of settings (",
                  file, ")");
        root["optimizer"]["max_grad_norm"] = s.get("max_norm");
      }
      s.drop("max_norm");
      for (const auto& kv : s.node()) s.fail(kv.first.as<std::string>(), kNotBuilt);
    }
    if (croot["clip_grad_norm"].IsDefined()) root.remove("clip_grad_norm");
  }
  ignore_section(root, "compile", ignored);  // no graph compiler: the same ops run either way
  {
    Sec s = sec("optimizer");
    if (s.present() && s.has("_target_")) {
      const std::string t = s.target();
      if (t == "torch.optim.AdamW") s.set("name", YAML::Node("adamw"));
      else if (t == "torch.optim.Adam") s.set("name", YAML::Node("adam"));
      else s.fail("_target_", std::string(kNotBuilt) + " (dtr builds torch.optim.AdamW and torch.optim.Adam)");
      s.drop("_target_");
      s.ignore({"foreach", "fused", "capturable", "differentiable"});
      s.reject_unless("amsgrad", is_false, "AMSGrad is not built in dtr");
      s.reject_unless("maximize", is_false, kNotBuilt);
    }
  }
  {
    Sec s = sec("lr_scheduler");
    if (s.present()) {
      s.ignore({"use_checkpoint_opt_param_scheduler", "override_opt_param_scheduler"});
      const double wd = as_number(sub(croot, "optimizer", "weight_decay"), 0.0);
      auto same_wd = [wd](const YAML::Node& v) { return is_none(v) || as_number(v, -1) == wd; };
      s.reject_unless("start_wd", same_wd, "a weight-decay schedule is not built in dtr (use optimizer.weight_decay)");
      s.reject_unless("end_wd", same_wd, "a weight-decay schedule is not built in dtr (use optimizer.weight_decay)");
      s.reject_unless("wd_incr_style", [](const YAML::Node& v) { return v.as<std::string>() == "constant"; },
                      "a weight-decay schedule is not built in dtr");
      s.ignore({"wd_incr_steps"});
      const double lr = as_number(sub(croot, "optimizer", "lr"), -1);
      s.reject_unless("max_lr", [lr](const YAML::Node& v) { return is_none(v) || as_number(v, -2) == lr; },
                      "dtr's peak lr is optimizer.lr (give the same value or leave max_lr out)");
      s.reject_unless("wsd_decay_steps", is_none, "WSD is not built in dtr");
      s.reject_unless("lr_wsd_decay_style", is_none, "WSD is not built in dtr");
    }
  }
  {
    Sec s = sec("step_scheduler");
    if (s.present()) {
      s.ignore({"log_remote_every_steps", "loss_average_window_steps", "gc_every_steps", "preemption_signal"});
      s.reject_unless("start_step", [](const YAML::Node& v) { return as_number(v, 1) == 0; },
                      "dtr resumes from checkpoint.checkpoint_dir (use 0)");
      s.reject_unless("start_epoch", [](const YAML::Node& v) { return as_number(v, 1) == 0; },
                      "dtr resumes from checkpoint.checkpoint_dir (use 0)");
      for (const char* k : {"max_steps", "val_every_steps", "ckpt_every_steps"})
        if (s.has(k) && is_none(s.get(k))) s.drop(k);
    }
  }
  {
    Sec s = sec("checkpoint");
    if (s.present()) {
      s.rename("max_recent_checkpoints", "keep_last");
      if (s.has("keep_last") && is_none(s.get("keep_last"))) s.set("keep_last", YAML::Node(0));
      if (s.has("save_consolidated") && s.get("save_consolidated").IsScalar() &&
          s.get("save_consolidated").Scalar() == "final")
        s.set("save_consolidated", YAML::Node(true));
      s.reject_unless("restore_from", is_none, "dtr resumes from the newest checkpoint in checkpoint_dir");
      s.reject_unless("model_save_format", [](const YAML::Node& v) { return v.as<std::string>() == "safetensors"; },
                      "dtr writes safetensors only");
      s.ignore({"model_cache_dir", "model_repo_id", "is_async", "wait_for_staging", "cpu_offload",
                "single_rank_consolidation", "staging_dir", "consolidation_timeout_minutes", "best_metric_key",
                "is_peft", "dequantize_base_checkpoint"});
    }
  }
  return root;
}

}  // namespace dtr::train
