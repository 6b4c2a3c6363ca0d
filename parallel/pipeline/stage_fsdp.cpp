// FSDP units driven by the pipeline (see stage_fsdp.h).
#include "parallel/pipeline/stage_fsdp.h"

#include "parallel/fsdp/fully_shard.h"

namespace dtr {
namespace {

std::vector<FSDPParamGroup*> groups_under(nn::Module& stage) {
  std::vector<FSDPParamGroup*> out;
  for (auto& [name, m] : stage.named_modules())
    if (FSDPParamGroup* g = fsdp_param_group(*m)) out.push_back(g);
  return out;
}

}  // namespace

void manage_fsdp_for_pipeline(nn::Module& stage) {
  if (!groups_under(stage).empty()) set_fsdp_hooks_enabled(stage, false);
}

void pipeline_unshard(nn::Module& stage) {
  auto groups = groups_under(stage);
  for (FSDPParamGroup* g : groups) {
    g->sync_requires_grad();
    g->unshard_async();
  }
  for (FSDPParamGroup* g : groups) g->wait_unshard();
}

void pipeline_reduce_gradients(nn::Module& stage) {
  auto groups = groups_under(stage);
  for (FSDPParamGroup* g : groups) g->reduce_grads_async();
  for (FSDPParamGroup* g : groups) g->finish_reduce_scatter();
  for (FSDPParamGroup* g : groups) g->finish_reduce_apply();
  for (FSDPParamGroup* g : groups) g->reshard();
}

void pipeline_reshard(nn::Module& stage) {
  for (FSDPParamGroup* g : groups_under(stage)) g->reshard();
}

}  // namespace dtr
