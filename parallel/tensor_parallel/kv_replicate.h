#pragma once
// KVReplicateParallel: tensor parallelism for k_proj / v_proj when the TP size exceeds the number
// of key/value heads (e.g. Gemma 3 270M: 1 kv head). As in Hugging Face transformers and vLLM
// (num_kv_head_replicas = tp / num_kv_heads), every rank computes the kv heads in full and keeps
// the one its query heads use: with q_proj ColwiseParallel, rank r holds query heads
// [r * Hq / tp, (r + 1) * Hq / tp), which all read kv head r / (tp / Hkv).
//   parameters (weight, bias, LoRA A / B)  Replicate (wrapped without communication)
//   input                                  Replicate
//   output [..., Hkv * D]                  -> [..., Hkv, rep, D] (each head repeated rep = tp / Hkv
//                                          times) -> Shard(-1) over tp -> local [..., D]
// Backward: the Shard -> Replicate redistribution gathers every rank's gradient of its head copy
// (an all_gather over tp) and the repeat sums them, so the replicated parameters receive the
// same, complete gradient on every rank. requires_grad is never changed.
// Source: vLLM QKVParallelLinear (num_kv_head_replicas); transformers' GQA TP handling.
#include "parallel/tensor_parallel/style.h"

namespace dtr {

class KVReplicateParallel : public ParallelStyle {
 public:
  /// `num_kv_heads`: the module's output heads (out_features / head_dim).
  explicit KVReplicateParallel(int64_t num_kv_heads);
  std::string type_name() const override { return "KVReplicateParallel"; }
  /// Errors: a module that is not a Linear / LoRALinear, tp % num_kv_heads != 0, or an output
  /// width not divisible by num_kv_heads.
  void apply(nn::Module& module, const std::string& fqn, const DeviceMesh& tp_mesh, DistributeMemo& memo) override;
  std::shared_ptr<ParallelStyle> clone() const override { return std::make_shared<KVReplicateParallel>(*this); }
  int64_t num_kv_heads;
};

}  // namespace dtr
