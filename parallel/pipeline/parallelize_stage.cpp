// Parallelizing a pipeline stage (see parallelize_stage.h).
#include "parallel/pipeline/parallelize_stage.h"

#include "parallel/model_parallelizer.h"
#include "parallel/pipeline/stage_fsdp.h"

namespace dtr {

void parallelize_pipeline_stage(nn::Module& stage, const MeshContext& ctx) {
  DTR_CHECK(!(ctx.strategy == DataParallelStrategy::ddp && ctx.dp_size > 1), "distributed.strategy=ddp with pp_size=", ctx.pp_size,
            " and dp_size=", ctx.dp_size, ": DDP inside pipeline stages is not built (use strategy fsdp2)");
  DTR_CHECK(!ctx.mp_policy.any_dtype(), "distributed.mp_policy with pp_size=", ctx.pp_size,
            ": mixed precision inside pipeline stages is not built (remove mp_policy or use pp_size 1)");
  parallelize_model(stage, ctx);
  manage_fsdp_for_pipeline(stage);
}

}  // namespace dtr
