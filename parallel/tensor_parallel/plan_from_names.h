#pragma once
// TP plans from style names: a recipe's `distributed.tp_plan` (module-name pattern -> style name),
// so TP runs for a model without a parallelizer sidecar and can override a sidecar's plan. The
// names are Hugging Face's base_model_tp_plan strings as NeMo Automodel translates them
// (translate_to_torch_parallel_style), plus an embedding_colwise twin:
//   colwise            ColwiseParallel()                              output Shard(-1), local
//   rowwise            RowwiseParallel()                              input Shard(-1), output Replicate
//   colwise_rep        ColwiseParallel(output_layouts=Replicate())    output gathered
//   rowwise_rep        RowwiseParallel(input_layouts=Replicate())
//   sequence_parallel  SequenceParallel()                             parameters replicated, Shard(1) in / out
//   embedding_rowwise  RowwiseParallel(input_layouts=Replicate())     vocab-parallel table, output Replicate
//   embedding_colwise  ColwiseParallel(output_layouts=Replicate())    table Shard(1) (hidden), output gathered
//   replicated_with_grad_allreduce  SequenceParallel(2, local output) for q_norm / k_norm: the weight
//                      replicated over tp, its gradient (from this rank's heads) reduced over tp
// As Automodel does for HF plans, the pattern `lm_head` with colwise_rep becomes
// ColwiseParallel(output_layouts=Shard(-1), use_local_output=False): the logits stay sharded and
// feed loss-parallel cross_entropy (the same loss; the full logits are never gathered).
// Source: NeMo Automodel components/distributed/parallelizer.py, transformers tensor_parallel.py.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/tensor_parallel/style.h"
#include "tensor/nn/module.h"

namespace dtr {

/// The style named `name`. Errors: an unknown name -> dtr::Error "<where>: unknown tensor-parallel
/// style '<name>' (expected <tp_style_names()>)".
std::shared_ptr<ParallelStyle> parallel_style_from_name(const std::string& name, const std::string& where);
/// The names parallel_style_from_name accepts, comma separated.
std::string tp_style_names();
/// The plan of (pattern, style name) entries, in order, with the lm_head rule above. `where` names
/// the recipe section in errors (e.g. "distributed.tp_plan").
ParallelizePlan plan_from_names(const std::vector<std::pair<std::string, std::string>>& entries,
                                const std::string& where);
/// Errors: a pattern of `plan` that matches no module of `model` -> dtr::Error naming `where`, the
/// pattern, the model type and a few of its module names.
void check_plan_matches(nn::Module& model, const ParallelizePlan& plan, const std::string& where);

}  // namespace dtr
