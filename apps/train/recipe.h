#pragma once
// Training recipe of dtr-train: a YAML file with NeMo Automodel's section and key names,
// `--set key.path=value` overrides, and validation that names the key and the file.
//
// Sections (every key optional unless noted; defaults in the structs below):
//   model:              path (GGUF file or HF dir) | config (debug | {LlamaConfig keys}), dtype
//   peft:               target_modules, exclude_modules, dim, alpha, dropout, dropout_position,
//                       use_rslora            (the section's presence turns LoRA on)
//   distributed:        read by parse_distributed (distributed_config.h) into a MeshContext
//   dataset:            type (chat_jsonl | text | token_shards | squad | column_mapped), path |
//                       paths, seq_len (0 = the longest sample, squad / column_mapped only),
//                       packed_sequence_size, pad_seq_len_divisible, doc_separator,
//                       limit_samples, shuffle, tokenizer (path or "bytes"), chat_template
//                       (chatml | smollm2), column_mapping (column_mapped: context / question /
//                       answer -> JSON field)
//   validation_dataset: same keys; optional
//   step_scheduler:     global_batch_size, local_batch_size, max_steps, num_epochs,
//                       ckpt_every_steps, val_every_steps, val_batches, on_nonfinite
//   optimizer:          name (adamw), lr, betas, eps, weight_decay, max_grad_norm
//   lr_scheduler:       lr_warmup_steps, lr_decay_style (cosine|linear|constant), min_lr,
//                       lr_decay_steps
//   checkpoint:         enabled, checkpoint_dir, keep_last, save_consolidated, adapter_dir,
//                       base_model_name_or_path
//   logging:            every_steps, metrics_file, plot_file, peak_tflops
//   rng:                seed
// Source of key names: NeMo Automodel recipes (../shared/reference/nemo-automodel-semantics.md).
// Automodel's own sections and `_target_` keys are rewritten onto these first
// (automodel_compat.h); shared names keep Automodel's defaults (StepSchedulerConfig,
// LRSchedulerConfig, CheckpointingConfig at NVIDIA-NeMo/Automodel 36044ad).
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtr::train {

struct ModelRecipe {
  std::string path;         // GGUF file or HF directory
  std::string config_name;  // "debug" for llama_debug_config()
  YAML::Node config;        // explicit LlamaConfig keys (a map), when given
  std::string dtype = "f32";
  std::string device = "cpu";  // cpu | cuda (each rank the GPU of its local rank)
  bool random() const { return path.empty(); }
};

struct PeftRecipe {
  bool enabled = false;
  std::vector<std::string> target_modules = {"*_proj"};
  std::vector<std::string> exclude_modules;
  int64_t dim = 8;
  double alpha = 32.0;
  double dropout = 0.0;
  std::string dropout_position = "post";  // pre | post
  bool use_rslora = false;
};

struct DatasetRecipe {
  bool enabled = false;
  std::string type = "chat_jsonl";  // chat_jsonl | text | token_shards
  std::vector<std::string> paths;
  int64_t seq_len = 256;  // chat samples are truncated to it; text / token_shards windows
  // NeMo Automodel's packed_sequence_size: > 0 packs chat / instruction samples into rows of this many tokens
  // (models/data/packing.h); 0 = one sample per row.
  int64_t packed_sequence_size = 0;
  // Unpacked rows: each micro-batch is padded to its longest sample rounded up to a multiple of
  // this (Automodel's collate pad_seq_len_divisible); seq_len pads every batch to seq_len.
  int64_t pad_seq_len_divisible = 8;
  std::string doc_separator;
  int64_t limit_samples = 0;  // 0 = all
  bool shuffle = true;
  std::string tokenizer;              // GGUF / tokenizer.json / HF dir / "bytes"; default model.path
  std::string chat_template = "chatml";  // chatml | smollm2 (chat_jsonl, squad, column_mapped)
  std::map<std::string, std::string> column_mapping;  // column_mapped: role -> JSON field
};

struct StepSchedulerRecipe {
  int64_t global_batch_size = 32;  // Automodel's StepSchedulerConfig default
  int64_t local_batch_size = 1;
  // Training stops at whichever comes first (NeMo Automodel's StepScheduler and its default of
  // 10 epochs): num_epochs epochs or max_steps optimizer steps.
  int64_t max_steps = 0;  // 0 = no step cap (num_epochs * batches per epoch)
  int64_t num_epochs = 10;
  int64_t ckpt_every_steps = 100;  // Automodel's default; 0 = only at the end (and epoch ends)
  bool save_checkpoint_every_epoch = true;  // also at the last step of every epoch (Automodel)
  int64_t val_every_steps = 0;   // 0 = only at the end (when a validation set is given)
  int64_t val_batches = 0;       // 0 = every full validation batch
  // A step whose loss or gradient norm is NaN / Inf: "error" stops the run before the update,
  // "skip" drops the update and goes on (see apps/train/health.h).
  std::string on_nonfinite = "error";

  /// Optimizer steps of the run for an epoch of `batches_per_epoch` steps: min(max_steps,
  /// num_epochs x batches_per_epoch), max_steps 0 meaning no cap. The epoch product saturates at
  /// INT64_MAX instead of wrapping (num_epochs 2^62 with 4 batches wrapped to 0 steps: a run
  /// that trained nothing and exited 0), so a huge num_epochs means "until max_steps".
  int64_t total_steps(int64_t batches_per_epoch) const;
};

struct OptimizerRecipe {
  std::string name = "adamw";  // adamw (torch.optim.AdamW) | adam (torch.optim.Adam, weight_decay 0 only)
  double lr = 1e-4;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;  // 0 = no clipping
};

/// Automodel's LRSchedulerConfig / OptimizerParamScheduler (Megatron-LM): without the section
/// the lr is optimizer.lr throughout; with it, the defaults below are resolved against the
/// schedule (resolve_lr_schedule in trainer.cpp): warmup min(1000, total / 10) steps from init_lr
/// to optimizer.lr, then decay to min_lr at lr_decay_steps.
struct LRSchedulerRecipe {
  bool enabled = false;                   // the section is present
  int64_t lr_warmup_steps = -1;           // -1 = min(1000, total_steps / 10)
  std::string lr_decay_style = "cosine";  // cosine | linear | constant
  double init_lr = -1;                    // -1 = 0.1 x optimizer.lr (lr of the first step)
  double min_lr = -1;                     // -1 = 0.01 x optimizer.lr
  int64_t lr_decay_steps = 0;             // 0 = total steps
};

struct CheckpointRecipe {
  bool enabled = true;
  std::string checkpoint_dir = "checkpoints";
  int64_t keep_last = 0;  // 0 = keep all (Automodel's max_recent_checkpoints: None)
  // Merged HF safetensors at the end. Unset: Automodel's "final" for a full fine-tune, off with
  // LoRA (whose final export is the PEFT adapter).
  bool save_consolidated = false;
  std::string adapter_dir;         // default <checkpoint_dir>/adapter
  // The PEFT adapter's base_model_name_or_path; default: see peft_base_model (export.h).
  std::string base_model_name_or_path;
};

struct LoggingRecipe {
  int64_t every_steps = 1;
  std::string metrics_file;  // default <checkpoint_dir>/metrics.jsonl
  std::string plot_file;     // default <checkpoint_dir>/loss.png
  double peak_tflops = 0.0;  // per rank, for MFU; 0 = no MFU shown; -1 ("measure") = start-up SGEMM
};

struct Recipe {
  std::string file;  // where it came from (messages)
  YAML::Node root;   // the merged tree (file + overrides)
  ModelRecipe model;
  PeftRecipe peft;
  YAML::Node distributed;
  DatasetRecipe dataset, validation_dataset;
  StepSchedulerRecipe step_scheduler;
  OptimizerRecipe optimizer;
  LRSchedulerRecipe lr_scheduler;
  CheckpointRecipe checkpoint;
  LoggingRecipe logging;
  uint64_t seed = 42;

  /// Automodel keys accepted without effect on results (automodel_compat.h), for one warning.
  std::vector<std::string> ignored_keys;

  /// Where a key came from, for messages: "configs/x.yaml", "--set optimizer.lr", or for a map
  /// changed by --set of its keys the file and each of them ("configs/x.yaml, --set
  /// distributed.dp_size, --set distributed.tp_size").
  std::string source_of(const std::string& key) const;
  std::vector<std::string> overridden;  // keys set by --set
};

/// Applies one override "a.b.c=value" to `root` (maps created as needed; the value is parsed
/// as YAML, so 3 / 0.5 / true / [a, b] get their types). Errors: no '=', empty key.
void apply_override(YAML::Node& root, const std::string& assignment);

/// Loads `file`, applies `overrides` in order, then parses and validates every section.
/// Errors (dtr::Error, one line naming the key and its source): unreadable file, YAML syntax
/// (line:col), an unknown section or key, a value of the wrong type, out-of-range numbers
/// (lr < 0, batch sizes < 1, ...), a dataset without path, a model with neither path nor
/// config. Checks that need the world size or the model (mesh, heads % tp, batch % dp, file
/// existence) are in validate_recipe_with_world (trainer.h).
Recipe load_recipe(const std::string& file, const std::vector<std::string>& overrides);

/// Same from an already parsed tree (tests).
Recipe parse_recipe(const YAML::Node& root, const std::string& file, const std::vector<std::string>& overridden = {});

/// The resolved recipe as YAML (defaults filled in), for --dry-run and checkpoint metadata.
std::string dump_recipe(const Recipe& r);

}  // namespace dtr::train
