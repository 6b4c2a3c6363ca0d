#include "parallel/mesh_context.h"

#include <sstream>

#include "tensor/error.h"

namespace dtr {

const char* strategy_name(DataParallelStrategy s) { return s == DataParallelStrategy::ddp ? "ddp" : "fsdp2"; }

void MeshContext::validate(const std::string& where) const {
  ParallelDims::validate(where);
  const bool ddp = strategy == DataParallelStrategy::ddp;
  DTR_CHECK(!(ddp && cp_size > 1), where, ".strategy=ddp does not support cp_size=", cp_size,
            " (context parallelism shards FSDP over dp_shard_cp: use fsdp2)");
  DTR_CHECK(!(ddp && ep_size > 1), where, ".strategy=ddp does not support ep_size=", ep_size, " (use fsdp2)");
  DTR_CHECK(!(ep_size > 1 && sequence_parallel), where, ".ep_size=", ep_size,
            " with sequence_parallel=true is not built in dtr (the MoE block needs whole sequences on each tp rank)");
  DTR_CHECK(!(ddp && (tp_size > 1 || dp_replicate_size > 1)), where,
            ".strategy=ddp needs tp_size=1 and dp_replicate_size=1 (got tp_size=", tp_size, ", dp_replicate_size=",
            dp_replicate_size, ")");
  DTR_CHECK(!(ddp && mp_policy.any_dtype()), where,
            ".mp_policy: mixed precision is applied by FSDP; strategy=ddp does not support it (use strategy fsdp2)");
  DTR_CHECK(!(ddp && offload_policy.enabled), where,
            ".offload_policy: CPU offload is an FSDP policy; strategy=ddp does not support it (use strategy fsdp2)");
  DTR_CHECK(fsdp2_forward_prefetch_depth >= 0 && fsdp2_backward_prefetch_depth >= 0, where,
            ": prefetch depths must be >= 0 (got ", fsdp2_forward_prefetch_depth, ", ", fsdp2_backward_prefetch_depth,
            ")");
}

std::string MeshContext::str() const {
  std::ostringstream os;
  os << "strategy=" << strategy_name(strategy) << " " << ParallelDims::str()
     << " sequence_parallel=" << (sequence_parallel ? "true" : "false") << " activation_checkpointing="
     << (activation_checkpointing ? checkpoint_policy_name(*activation_checkpointing) : "none");
  if (!tp_plan.empty()) os << " tp_plan=recipe (" << tp_plan.size() << " entries)";
  if (!defer_fsdp_grad_sync) os << " defer_fsdp_grad_sync=false (gradients reduced every micro-batch)";
  if (offload_policy.enabled)
    os << " offload_policy=cpu (CPU run: shards, gradients and optimizer state already in host memory)";
  return os.str();
}

}  // namespace dtr
