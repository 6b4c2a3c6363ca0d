#pragma once
// What dtr-train resolves before any model tensor exists: the model config, the mesh settings,
// gradient accumulation, parameter counts and a memory estimate (the --dry-run report), then
// the datasets and the model itself.
#include <memory>
#include <string>
#include <vector>

#include "apps/train/recipe.h"
#include "models/data/sample.h"
#include "models/formats/hf_config.h"
#include "models/lora/inject.h"
#include "models/transformer/causal_lm.h"
#include "apps/train/distributed_config.h"
#include "models/transformer/memory_plan.h"
#include "parallel/mesh_context.h"

namespace dtr::train {

/// Everything checked and derived from the recipe and the world size alone.
struct Plan {
  LlamaConfig config;
  std::string model_source;  // "model.path=..." or "model.config=debug" (messages)
  MeshContext mesh;          // validated, mesh not built yet
  int64_t dp_size = 1, grad_accum = 1;
  /// distributed.pp_size > 1: rows per pipeline micro-batch (distributed.pipeline.pp_microbatch_size,
  /// default step_scheduler.local_batch_size).
  int64_t pp_microbatch_rows = 1;
  int64_t total_params = 0, trainable_params = 0;
  MemoryPlan memory;                 // per rank (plan_step_memory)
  double memory_estimate_bytes = 0;  // memory.peak_bytes
};

/// Validates what needs the world size or the model config, without allocating the model:
/// model file exists (GGUF metadata / config.json only are read), mesh sizes (MeshContext),
/// heads and kv heads divisible by tp, global_batch_size divisible by local_batch_size x dp.
/// Errors: dtr::Error, one line naming the key, the numbers and the source.
Plan make_plan(const Recipe& r, int world_size);

/// Parameter count of a decoder with `c` (biases off; MoE layers hold all E experts), and the
/// LoRA parameters that `peft` would add (0 when disabled), from the module FQNs the model would have.
int64_t llama_param_count(const LlamaConfig& c);
int64_t lora_param_count(const LlamaConfig& c, const PeftRecipe& peft);

/// The memory / comm plan of one training step per rank (models/transformer/memory_plan.h) on
/// the meta-built model (LoRA included) under p.mesh.
MemoryPlan plan_step_memory(const Recipe& r, const Plan& p);

/// The LoRA settings of the recipe's peft section.
LoraConfig lora_config(const Recipe& r);

/// The human-readable --dry-run report (recipe, mesh, counts, memory).
std::string dry_run_report(const Recipe& r, const Plan& p);

/// Loads a dataset section into samples (chat_jsonl: one per conversation, unpadded, or packs of
/// packed_sequence_size tokens when it is > 0; text / token_shards: windows of seq_len).
/// `pad_id` (when given) receives the id collate pads with: the tokenizer's pad, else its eos,
/// else 0. Errors name the dataset key and file.
std::vector<data::Sample> load_samples(const Recipe& r, const DatasetRecipe& d, const std::string& name,
                                       int32_t* pad_id = nullptr);

/// Builds the model on this rank on meta tensors (no memory: parallelize_model materialises each
/// rank's shards): random (seeded with rng.seed) from the config, or reading model.path's byte
/// ranges (load_model_meta; MoE HF checkpoints load eagerly); LoRA injected (base frozen) when
/// peft is set.
std::shared_ptr<LlamaForCausalLM> build_model(const Recipe& r, const Plan& p);

}  // namespace dtr::train
