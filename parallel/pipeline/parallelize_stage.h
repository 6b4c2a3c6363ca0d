#pragma once
// Parallelizing one pipeline stage: the stage module gets what parallelize_model gives a whole
// model (TP with its plan, activation checkpointing, FSDP units per layer and a root unit) on
// this rank's (dp, tp) slice of the mesh, then its FSDP units are handed to the pipeline
// (stage_fsdp.h). Source: Automodel's AutoPipeline (parallelize_fn applied to each model part),
// torchtitan's pipeline_llm.
#include "parallel/mesh_context.h"
#include "tensor/nn/module.h"

namespace dtr {

/// Parallelizes `stage` in place (ctx.mesh built; its pp coordinate is this rank's stage).
/// Errors (one line naming the key): strategy ddp with dp > 1 (DDP's per-backward reduction is
/// not built under pipeline parallelism), an mp_policy dtype (its casts are FSDP hook work,
/// which the pipeline does not run: not built), whatever parallelize_model raises.
void parallelize_pipeline_stage(nn::Module& stage, const MeshContext& ctx);

}  // namespace dtr
