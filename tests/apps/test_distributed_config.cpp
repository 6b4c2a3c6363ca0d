// The reader of a recipe's `distributed:` section (apps/train/distributed_config.h): NeMo's
// keys into a MeshContext, dp derived, and the one-line errors naming the key and the numbers.
#include <catch2/catch.hpp>
#include <yaml-cpp/yaml.h>

#include "apps/train/distributed_config.h"
#include "tensor/error.h"

using namespace dtr;
using namespace dtr::train;

namespace {

MeshContext ctx_from(const std::string& yaml, int64_t world) {
  return parse_distributed(YAML::Load(yaml), world, "test.yaml: distributed");
}

}  // namespace

TEST_CASE("parse_distributed derives dp and rejects bad settings with named keys", "[distributed_config]") {
  MeshContext c = ctx_from("{tp_size: 2}", 8);
  CHECK(c.dp_size == 4);
  CHECK(c.strategy == DataParallelStrategy::fsdp2);
  CHECK_THROWS_WITH(ctx_from("{tp_size: 3}", 4), Catch::Contains("tp_size") && Catch::Contains("not divisible"));
  CHECK_THROWS_WITH(ctx_from("{dp_size: 3}", 4), Catch::Contains("!= world size 4"));
  CHECK_THROWS_WITH(ctx_from("{tp_sise: 2}", 4), Catch::Contains("unknown key 'tp_sise'"));
  CHECK(ctx_from("{pp_size: 2}", 4).dp_size == 2);  // pipeline parallelism: pp x dp
  CHECK_THROWS_WITH(ctx_from("{pp_size: 2, cp_size: 2}", 4), Catch::Contains("pp_size=2 with ep_size / cp_size"));
  CHECK_THROWS_WITH(ctx_from("{pp_size: 2, pipeline: {pp_schedule: zb}}", 4),
                    Catch::Contains("distributed.pipeline.pp_schedule") && Catch::Contains("unknown pipeline schedule"));
  CHECK_THROWS_WITH(ctx_from("{pp_size: 2, pipeline: {layer_per_stage: 2}}", 4),
                    Catch::Contains("unknown key 'layer_per_stage'"));
  CHECK_THROWS_WITH(ctx_from("{strategy: megatron_fsdp}", 4), Catch::Contains("megatron_fsdp"));
  CHECK_THROWS_WITH(ctx_from("{dp_replicate_size: 3}", 4), Catch::Contains("dp_replicate_size=3"));
  CHECK_THROWS_WITH(ctx_from("{tp_size: two}", 4), Catch::Contains("tp_size") && Catch::Contains("integer"));
  // 7 x 7905747460161236407 = 1 (mod 2^64): wrapped to the world size and passed before.
  CHECK_THROWS_WITH(ctx_from("{dp_size: 7, tp_size: 7905747460161236407}", 1), Catch::Contains("overflows int64"));
  CHECK_THROWS_WITH(ctx_from("{tp_size: 7, cp_size: 7905747460161236407}", 1), Catch::Contains("overflows int64"));
  CHECK(ctx_from("{dp_replicate_size: 2, mp_policy: {param_dtype: bf16, reduce_dtype: float32}}", 4).mp_policy.param_dtype ==
        DType::bf16);
  CHECK(c.defer_fsdp_grad_sync);
  CHECK_FALSE(ctx_from("{defer_fsdp_grad_sync: false}", 4).defer_fsdp_grad_sync);
  CHECK_THROWS_WITH(ctx_from("{defer_fsdp_grad_sync: maybe}", 4), Catch::Contains("defer_fsdp_grad_sync: expected true or false"));
  CHECK_FALSE(c.offload_policy.enabled);
  const MeshContext off =
      ctx_from("{offload_policy: {_target_: torch.distributed.fsdp.CPUOffloadPolicy, pin_memory: false}}", 4);
  CHECK(off.offload_policy.enabled);
  CHECK_FALSE(off.offload_policy.pin_memory);
  CHECK(off.str().find("offload_policy=cpu") != std::string::npos);
  CHECK(ctx_from("{offload_policy: true}", 4).offload_policy.enabled);
  CHECK_FALSE(ctx_from("{offload_policy: {_target_: torch.distributed.fsdp.OffloadPolicy}}", 4).offload_policy.enabled);
  CHECK_THROWS_WITH(ctx_from("{offload_policy: {pin: true}}", 4), Catch::Contains("offload_policy: unknown key 'pin'"));
  CHECK_THROWS_WITH(ctx_from("{offload_policy: {_target_: my.Offload}}", 4),
                    Catch::Contains("offload_policy._target_='my.Offload'"));
  CHECK_THROWS_WITH(ctx_from("{strategy: ddp, mp_policy: {param_dtype: bf16}}", 4),
                    Catch::Contains("mp_policy") && Catch::Contains("strategy=ddp"));
  CHECK_THROWS_WITH(ctx_from("{strategy: ddp, offload_policy: true}", 4),
                    Catch::Contains("offload_policy") && Catch::Contains("strategy=ddp"));
}

TEST_CASE("parse_distributed reads the strategy and activation checkpointing as enums", "[distributed_config]") {
  CHECK(ctx_from("{strategy: ddp}", 2).strategy == DataParallelStrategy::ddp);
  CHECK_FALSE(ctx_from("{}", 2).activation_checkpointing.has_value());
  CHECK_FALSE(ctx_from("{activation_checkpointing: false}", 2).activation_checkpointing.has_value());
  CHECK(ctx_from("{activation_checkpointing: true}", 2).activation_checkpointing == CheckpointPolicy::full);
  CHECK(ctx_from("{activation_checkpointing: selective}", 2).activation_checkpointing == CheckpointPolicy::selective);
  CHECK_THROWS_WITH(ctx_from("{activation_checkpointing: some}", 2),
                    Catch::Contains("activation_checkpointing: expected true, false, full or selective, got 'some'"));
  CHECK(ctx_from("{strategy: ddp, activation_checkpointing: selective}", 2).str() ==
        "strategy=ddp world=2 dp=2 (replicate 1 x shard 2) tp=1 sequence_parallel=false "
        "activation_checkpointing=selective");
  // The exact texts the bad-input corpus and users see.
  CHECK_THROWS_WITH(ctx_from("{tp_size: 3}", 4),
                    "test.yaml: distributed: world size 4 is not divisible by tp_size*cp_size*pp_size=3 (tp_size=3, "
                    "cp_size=1, pp_size=1)");
  CHECK_THROWS_WITH(ctx_from("{dp_size: 2}", 3),
                    "test.yaml: distributed: dp_size*tp_size*cp_size*pp_size = 2*1*1*1 = 2 != world size 3");
  CHECK_THROWS_WITH(ctx_from("{tp_size: 0}", 4), "test.yaml: distributed.tp_size=0: must be >= 1");
}

TEST_CASE("parse_distributed reads tp_plan in recipe order and rejects bad styles in one line", "[tp_plan]") {
  const MeshContext c = parse_distributed(
      YAML::Load("{tp_plan: {emb: embedding_rowwise, 'layers.*.fc1': colwise, head: colwise_rep}}"), 1, "t: distributed");
  REQUIRE(c.tp_plan.size() == 3);
  CHECK(c.tp_plan[1] == std::pair<std::string, std::string>{"layers.*.fc1", "colwise"});  // recipe order kept
  CHECK_THROWS_WITH(parse_distributed(YAML::Load("{tp_plan: {head: diagonal}}"), 1, "t: distributed"),
                    Catch::Contains("t: distributed.tp_plan.head: unknown tensor-parallel style 'diagonal'") &&
                        Catch::Contains("colwise_rep"));
  CHECK_THROWS_WITH(parse_distributed(YAML::Load("{tp_plan: [colwise]}"), 1, "t: distributed"),
                    Catch::Contains("t: distributed.tp_plan: expected a map of module-name pattern -> style"));
}
